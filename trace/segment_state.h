// The life cycle of a segment key, one explicit state machine: cold -> hot -> on trial
// (the guard measures the fused program against per-op runs) -> ready (tier 1, then tier
// 2 once a native kernel swapped in) or demoted (per op, re-tried later) -> blacklisted
// (a fused run failed, or the key can never fuse). Every transition is checked here and
// written to the trace as a SegmentState event.
#pragma once

#include <cstdint>

namespace neuron::trace {

enum class SegmentState : uint8_t {
  kCold = 0,
  kHot = 1,
  kOnTrial = 2,
  kReadyTier1 = 3,
  kReadyTier2 = 4,
  kDemoted = 5,
  kBlacklisted = 6,
  kCount
};

const char* state_name(SegmentState state);
// Whether the life cycle allows from -> to (a reset to cold is no transition: keys are
// forgotten instead).
bool transition_allowed(SegmentState from, SegmentState to);
// Writes a SegmentState event (value key, flags from << 8 | to, aux count) when tracing.
void emit_state_event(uint64_t key, SegmentState from, SegmentState to, uint64_t count);

}  // namespace neuron::trace
