// Trace events: fixed-size records written by the engine's hot path and by workers, and
// stored as-is (in compressed chunks) in trace files. See docs/trace-format.md.
#pragma once

#include <cstdint>

namespace neuron::trace {

enum class EventKind : uint8_t {
  kOpDispatch = 1,  // host thread: the op was recorded and queued (duration = host cost)
  kOpExecute = 2,   // worker: the op ran (duration = device time)
  kSync = 3,        // host waited for the device (value = cause string id)
  kSegmentCut = 4,  // a candidate segment closed (value = key, aux = length, flags = reason)
  kKeyHit = 5,      // the segment key was seen before (value = key, aux = count)
  kKeyMiss = 6,     // first sight of a key (value = key)
  kMemory = 7,      // counter: value = allocated bytes, aux = reserved bytes
  kQueueDepth = 8,  // counter: value = work items pending on the stream
  kFallback = 9,    // an op ran synchronously (value = reason string id)
  kCompileStart = 10,
  kCompileEnd = 11,
  kSegmentExecute = 12,
  kOpDataflow = 13,       // host: links of an op's tensor slots (see trace/dataflow.h)
  kSegmentLiveness = 14,  // host: outputs of a cut segment that were dead at the cut
  kStreamFlush = 15,      // host: a forced cut point (seq = last op before it, flags = reason)
  // The online guard's verdict on a key (value = key, aux = fused median span ns, seq =
  // per-op median span ns, op = pairs compared, reserved = trial number, flags = verdict:
  // 1 kept, 2 demoted, 3 undecided so per op).
  kGuardVerdict = 16,
  // A key's state transition (value = key, flags = from << 8 | to, aux = occurrences; the
  // states of trace/segment_state.h).
  kSegmentState = 17,
  // The collective stream ran a collective, or started a point-to-point transfer (value =
  // call name string id, aux = bytes, reserved = group string id, seq = the group's call
  // number, duration = the worker's time in it; stream = the collective stream).
  kCollective = 18,
};

// Why a segment was cut (SegmentCut flags).
enum class CutReason : uint16_t {
  kSync = 1,
  kBarrier = 2,
  kContent = 3,     // content-defined cut point (after a matmul-class op or rolling-hash mask)
  kMaxLength = 4,
  kFlush = 5,       // end of recording
  kRegion = 6,      // entry or exit of a compiled region (torch.compile's graph)
};

#pragma pack(push, 1)
struct Event {
  uint64_t time_ns = 0;      // since the trace started (steady clock)
  uint64_t duration_ns = 0;  // 0 for instants and counters
  uint64_t seq = 0;          // op sequence number: links dispatch to execute
  uint64_t value = 0;        // kind-specific (see EventKind)
  uint64_t aux = 0;          // kind-specific
  uint32_t op = 0;           // OpId, 0 when not an op event
  uint16_t thread = 0;       // recorder thread id (names in the string table)
  uint8_t kind = 0;          // EventKind
  uint8_t core = 0;
  uint16_t stream = 0;
  uint16_t flags = 0;
  uint32_t reserved = 0;
};
#pragma pack(pop)
static_assert(sizeof(Event) == 56, "the on-disk event layout is part of the format");

}  // namespace neuron::trace
