// Offline replay: re-runs the adaptive controller's decisions (segmenting, hotness, the
// cost gate, tiers) over a recorded op stream under any policy, without executing
// anything, and predicts device time with a cost model. Mirrors the live engine: the same
// trace::Segmenter with settings from fusion::segment_policy_of (as engine/active_policy.cpp),
// cuts, keys and liveness as engine/recording.cpp closes segments, hotness and the cost
// gate as engine/adaptive_cut.cpp decides at the cut. Tests check it reproduces a
// recording's own decisions exactly. Split: replay_trace.cpp prepares the trace,
// replay.cpp replays it under a policy, replay_costs.cpp predicts the time.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <unordered_map>
#include <vector>

#include "fusion/cost_model.h"
#include "fusion/policy.h"
#include "trace/event.h"

namespace neuron::fusion {

// A segment occurrence as the recording saw it.
struct RecordedSegment {
  uint32_t stream = 0;  // dense stream index
  uint32_t first = 0;   // op index of its first op
  uint32_t last = 0;    // and of its last
  uint32_t length = 0;
  uint64_t key = 0;
  uint8_t reason = 0;   // trace::CutReason
  bool fused = false;   // a SegmentExecute ran it
  double fused_ns = 0;  // and took this long
};

// A recorded trace prepared once (dataflow resolved, timings gathered), replayed per policy.
struct ReplayTrace {
  static constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();  // no op / segment
  // Per op, in seq order.
  std::vector<uint64_t> seq, signature, bytes, flops, exec_ns;
  std::vector<uint32_t> op, stream;
  std::vector<uint8_t> measured;      // an OpExecute gave exec_ns
  std::vector<uint8_t> forced_after;  // trace::CutReason of a forced cut after the op, or 0
  std::vector<uint32_t> recorded;     // index of the op's recorded segment, or kNone
  // Tensor slots (inputs, then outputs) of op i: [slot_begin[i], slot_begin[i + 1]).
  std::vector<uint32_t> slot_begin, slot_class;  // class: storage identity, 0 = no tensor
  std::vector<uint8_t> slot_output, slot_dead;   // dead: a dead output at the recorded cut
  std::vector<uint32_t> class_last_use;          // per class: last op reading it
  std::vector<uint32_t> stream_ids;              // dense index -> core << 16 | stream
  std::vector<RecordedSegment> segments;         // in cut order
  std::vector<uint64_t> compiled_keys;           // CompileEnd, in order
  std::unordered_map<uint64_t, std::pair<double, uint64_t>> fused_time;  // key -> sum ns, n
  double compile_ns_mean = 0;
  bool has_dataflow = false, has_stream_flush = false;
};

// events: a whole trace (any order). matmul_ops: the trace's op ids of matmul-class ops.
ReplayTrace prepare_replay(const trace::Event* events, size_t n);

// What replay saw of a segment key, for hooks and reports.
struct ReplaySegment {
  uint64_t key = 0;
  uint32_t length = 0, first_op = 0;  // first_op: op id of its first op
  uint64_t count = 0;                 // occurrences so far (this one included)
  double per_op_ns = 0, fused_ns = 0; // predicted per occurrence
};

struct ReplayOptions {
  Policy policy;
  CostModel cost;
  std::vector<uint32_t> cut_after_ops;  // op ids (the policy's matmul class and any extra)
  std::vector<uint32_t> whole_run_ops;  // op ids of _foreach_ ops (foreach_runs_whole)
  std::vector<uint64_t> op_kinds;       // by op id: trace::op_kind of its name (0: unknown)
  // Optional: replaces Policy::should_compile for hot keys (Python policy objects).
  std::function<bool(const ReplaySegment&)> should_compile;
};

struct KeyDecision {
  uint64_t key = 0;
  uint32_t length = 0, first_op = 0;
  uint64_t occurrences = 0, fused = 0;
  int64_t compiled_at = -1;     // occurrence (1-based) whose cut built the program, -1: none
  std::string decision;         // fused | cold | rejected: cost gate | rejected: single op
  bool native = false;          // the policy's tier would also build a native program
  double per_op_ns = 0, fused_ns = 0;  // predicted per occurrence (means)
};

struct ReplayResult {
  double device_ns = 0, per_op_ns = 0, fused_ns = 0;
  double compile_ns = 0;
  uint64_t compiles = 0, native_compiles = 0;
  uint64_t ops = 0, ops_fused = 0, occurrences = 0, occurrences_fused = 0;
  uint64_t key_mismatches = 0, matched_segments = 0;  // fidelity: recomputed vs recorded keys
  double fused_ratio = 1.0;                           // measured mode's calibration
  std::vector<KeyDecision> keys;                      // in order of first sight
  // Occurrences, in cut order: stream, first op seq, length, key, reason, fused.
  std::vector<uint32_t> occ_stream, occ_length;
  std::vector<uint64_t> occ_first_seq, occ_key;
  std::vector<uint8_t> occ_reason, occ_fused;
  std::vector<uint64_t> compiled_keys;  // in order
};

ReplayResult replay(const ReplayTrace& trace, const ReplayOptions& options);

}  // namespace neuron::fusion
