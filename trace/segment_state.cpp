#include "trace/segment_state.h"

#include "trace/event.h"
#include "trace/recorder.h"

namespace neuron::trace {

const char* state_name(SegmentState state) {
  switch (state) {
    case SegmentState::kCold: return "cold";
    case SegmentState::kHot: return "hot";
    case SegmentState::kOnTrial: return "on_trial";
    case SegmentState::kReadyTier1: return "ready_tier1";
    case SegmentState::kReadyTier2: return "ready_tier2";
    case SegmentState::kDemoted: return "demoted";
    case SegmentState::kBlacklisted: return "blacklisted";
    default: return "?";
  }
}

bool transition_allowed(SegmentState from, SegmentState to) {
  using S = SegmentState;
  switch (from) {
    case S::kCold: return to == S::kHot;
    case S::kHot: return to == S::kOnTrial || to == S::kReadyTier1 || to == S::kBlacklisted;
    case S::kOnTrial:
      return to == S::kReadyTier1 || to == S::kReadyTier2 || to == S::kDemoted || to == S::kBlacklisted;
    case S::kReadyTier1: return to == S::kReadyTier2 || to == S::kBlacklisted || to == S::kOnTrial;
    case S::kReadyTier2: return to == S::kBlacklisted || to == S::kOnTrial;
    case S::kDemoted: return to == S::kOnTrial || to == S::kBlacklisted;
    default: return false;
  }
}

void emit_state_event(uint64_t key, SegmentState from, SegmentState to, uint64_t count) {
  if (!recording()) return;
  auto& rec = Recorder::instance();
  Event e;
  e.time_ns = rec.now_ns();
  e.kind = static_cast<uint8_t>(EventKind::kSegmentState);
  e.value = key;
  e.aux = count;
  e.flags = static_cast<uint16_t>(static_cast<unsigned>(from) << 8 | static_cast<unsigned>(to));
  rec.emit(e);
}

}  // namespace neuron::trace
