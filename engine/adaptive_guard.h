// The online guard on the engine side (fusion/guard.h decides): per trial occurrence two
// marker items on the stream time its device span, from the moment the device could
// start its first op (the start marker runs once the op was dispatched and the work
// before it ran) to the end of its last op. Used by the adaptive controller
// (adaptive_window.cpp, adaptive_cut.cpp) under the stream's mutex.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "backend/stream.h"
#include "fusion/guard.h"

namespace neuron::engine {

// Filled by the start marker on the worker, read by the end marker.
struct TrialSpan {
  std::atomic<uint64_t> start_ns{0};
};

// Queues the start marker of an occurrence that may belong to a key on trial.
std::shared_ptr<TrialSpan> queue_trial_start(backend::Stream& stream);
// Queues the end marker: it hands the span to the guard as occurrence `occurrence`.
void queue_trial_end(backend::Stream& stream, std::shared_ptr<TrialSpan> span,
                     std::shared_ptr<fusion::KeyGuard> guard, int64_t occurrence,
                     fusion::RunMode ran);
// Traces a verdict (GuardVerdict event).
void emit_guard_verdict(uint64_t key, const fusion::GuardReport& report, uint8_t core);

// Counters (trace/counters.h): guard_trials, guard_retrials, guard_kept, guard_demotions,
// guard_undecided.
void count_guard_trial(bool retrial);
void count_guard_verdict(fusion::GuardVerdict verdict);

}  // namespace neuron::engine
