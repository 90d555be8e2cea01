#include "engine/stream_state.h"

#include <array>
#include <memory>
#include <mutex>

#include "backend/runtime.h"

namespace neuron::engine {
namespace {

std::array<std::array<std::unique_ptr<StreamState>, backend::kMaxStreamsPerCore>, 64> g_states;
std::mutex g_states_mutex;

}  // namespace

StreamState& stream_state(c10::DeviceIndex core, int64_t stream) {
  auto& slot = g_states.at(static_cast<size_t>(core)).at(static_cast<size_t>(stream));
  if (!slot) {
    std::lock_guard lock(g_states_mutex);
    if (!slot)
      slot = std::make_unique<StreamState>(current_segment_policy(), current_stream_trial(),
                                           static_cast<uint64_t>(core) * backend::kMaxStreamsPerCore +
                                               static_cast<uint64_t>(stream));
  }
  return *slot;
}

StreamState* find_stream_state(c10::DeviceIndex core, int64_t stream) {
  return g_states.at(static_cast<size_t>(core)).at(static_cast<size_t>(stream)).get();
}

void restart_segmenters() {
  const fusion::StreamTrialSettings trial = current_stream_trial();
  uint64_t seed = 0;
  for (auto& core : g_states)
    for (auto& slot : core) {
      const uint64_t slot_seed = seed++;  // as stream_state() seeds it: core * streams + stream
      if (!slot) continue;
      std::lock_guard lock(slot->mutex);
      slot->segmenter = trace::Segmenter(current_segment_policy());
      // A new policy: every stream records again and settles by the new settings.
      slot->settled_ops = 0;
      slot->stretch_open = false;
      slot->idle_cuts = 0;
      slot->settle_round = 0;
      slot->stream_guard = fusion::StreamGuard(trial, slot_seed);
      slot->guard_stretch = false;
    }
}

}  // namespace neuron::engine
