// The one monotonic clock of the project's timings: durations, deadlines and backoffs, in
// nanoseconds of std::chrono::steady_clock. (Trace event times are the recorder's own
// now_ns(), relative to the recording's start.)
#pragma once

#include <chrono>
#include <cstdint>

namespace neuron::trace {

inline uint64_t steady_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

}  // namespace neuron::trace
