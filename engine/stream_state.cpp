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
    if (!slot) slot = std::make_unique<StreamState>(current_segment_policy());
  }
  return *slot;
}

StreamState* find_stream_state(c10::DeviceIndex core, int64_t stream) {
  return g_states.at(static_cast<size_t>(core)).at(static_cast<size_t>(stream)).get();
}

void restart_segmenters() {
  for (auto& core : g_states)
    for (auto& slot : core) {
      if (!slot) continue;
      std::lock_guard lock(slot->mutex);
      slot->segmenter = trace::Segmenter(current_segment_policy());
      // A new policy: every stream records again and settles by the new settings.
      slot->settled_ops = 0;
      slot->stretch_open = false;
      slot->idle_cuts = 0;
      slot->settle_round = 0;
    }
}

}  // namespace neuron::engine
