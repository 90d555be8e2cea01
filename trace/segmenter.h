// Cuts the op stream into candidate segments by content, so a loop body yields the same
// segments every iteration whatever its phase, and keys each segment with XXH3 over op
// signatures, dataflow edges, aliasing of external inputs and liveness of outputs.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "trace/event.h"
#include "trace/op_record.h"
#include "trace/small_vec.h"

namespace neuron::trace {

struct SegmentPolicy {
  uint32_t max_length = 256;        // cut when a segment reaches this many ops
  uint32_t rolling_window = 4;      // ops hashed by the rolling content hash
  // Segments of at least this many ops (and 2 x rolling_window) are cut before their first
  // op repeats after the same rolling_window ops: a loop body the hash never cuts.
  uint32_t loop_min_ops = 128;
  uint64_t rolling_mask = 0xf;      // cut when the rolling hash & mask == 0 (~1 in 16)
  std::vector<OpId> cut_after;      // a run of matmul-class ops ends a segment
  bool use_rolling_cut = true;
  bool keep_runs_whole = true;      // a content cut inside a run of whole_run ops moves to its end
  // The rolling hash reads ops with their shapes (signatures) or as ops alone (kinds):
  // without shapes a loop body is cut at the same places whatever its batch size, so
  // keys of different shapes line up (one family, trace::Segment::family).
  bool rolling_shapes = false;
};

// SegmentOp::kind of an op by its name ("aten::mul.Tensor"): the engine's and replay's.
uint64_t op_kind(std::string_view name);

// One op as the segmenter sees it.
struct SegmentOp {
  OpId op = 0;
  uint64_t signature = 0;               // the op record's hash
  uint64_t kind = 0;                    // the op alone, stable across processes (a hash of
                                        // its name; 0: unknown, the signature stands in)
  SmallVec<uint64_t, 6> inputs;         // storage identities of tensor inputs (0: none)
  SmallVec<uint64_t, 6> outputs;        // storage identities of fresh outputs
  uint64_t seq = 0;
  bool barrier = false;                 // cut before and after; never inside a segment
  bool whole_run = false;               // a run of such ops (foreach ops: an optimizer step,
                                        // one fused group) is never split by a content cut
};

struct Segment {
  uint64_t key = 0;
  uint32_t length = 0;
  uint64_t first_seq = 0;
  CutReason reason = CutReason::kFlush;
  std::vector<int64_t> words;           // the full canonical form the key hashes
  // The key with every op's signature replaced by its op: segments that differ only in
  // shapes, scalars or dtypes (a batch size that changes, a KV cache that grows) share it.
  uint64_t family = 0;
};

class Segmenter {
 public:
  explicit Segmenter(SegmentPolicy policy = {});
  // Adds one op; returns the reason to cut now, if any (the caller then calls flush,
  // with liveness). A barrier op is not added: the open segment must close before it.
  std::optional<CutReason> add(const SegmentOp& op);
  // Content cut before op (the caller closes the open segment, then adds op): op and the
  // rolling_window ops before it repeat the open segment's first op and the ops before
  // that, so a loop whose body the rolling hash never cuts still yields one segment per
  // iteration, in phase. Only for long segments (at least half the maximum length and
  // twice the rolling window: shorter ones end by content anyway, and cutting them at
  // repeated layers fused less of a small Llama step); on with rolling cuts.
  // Also the cut after a run of cut_after ops: they end a segment together, so back-to-
  // back matmuls (a backward's two gradients, q/k/v projections) are not one-op segments.
  // And a rolling-hash cut that fell on a whole_run op (keep_runs_whole): it comes here,
  // before the run's first other op.
  bool cut_before(const SegmentOp& op) const;
  // add() then flush() without liveness information.
  void push(const SegmentOp& op, std::vector<Segment>& closed);
  // Closes the open segment (sync, stream change, end). alive marks, per output of the
  // segment in order, whether it is still referenced; empty = all alive.
  std::optional<Segment> flush(CutReason reason, const std::vector<bool>& alive = {});
  // flush() into a caller's segment, reusing its words' memory; false if nothing was open.
  bool flush_into(CutReason reason, const std::vector<bool>& alive, Segment& out);
  uint32_t open_length() const { return static_cast<uint32_t>(ops_.size()); }
  // Canonical words of the open segment's ops so far, without liveness: a prefix of the
  // words the segment will have when it closes (the adaptive controller verifies groups
  // it launches before the cut against a ready program with it).
  std::vector<int64_t> open_op_words() const;
  // Outputs of the open segment, in order (for the caller's liveness check), into out
  // (its memory reused).
  void open_outputs_into(std::vector<uint64_t>& out) const;
  const SegmentPolicy& policy() const { return policy_; }

 private:
  bool content_cut(const SegmentOp& op);
  bool is_cut_after(OpId op) const;

  SegmentPolicy policy_;
  std::vector<SegmentOp> ops_;
  std::vector<uint64_t> recent_;  // signatures of the last rolling_window ops (any segment)
  std::vector<uint64_t> before_start_;  // recent_ when the open segment started
  bool after_cut_op_ = false;           // the open segment's last op is a cut_after op
  bool deferred_cut_ = false;           // a content cut waits for the end of a whole run
};

// Canonical words and key of a sequence of ops (exposed for tests and replay).
Segment make_segment(const std::vector<SegmentOp>& ops, CutReason reason,
                     const std::vector<bool>& alive);
// The same into a caller's segment, reusing its words' memory (the dispatch path).
void make_segment_into(const std::vector<SegmentOp>& ops, CutReason reason,
                       const std::vector<bool>& alive, Segment& out);
// The signatures of a segment's first `length` ops, in order, read back from its words
// (each op's words start with its signature).
std::vector<uint64_t> op_signatures(const std::vector<int64_t>& words, uint32_t length);

}  // namespace neuron::trace
