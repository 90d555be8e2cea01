// Turns a recorded segment into a program: runs of consecutive pointwise ops over tensors
// of one shape become tile groups (executed tile by tile so intermediates stay in cache);
// everything else stays an extern step (the op's own kernel, run by the backend).
#pragma once

#include <cstdint>
#include <vector>

#include "trace/small_vec.h"

namespace neuron::fusion {

// One op of a segment as the planner sees it. Values are numbered by the caller; the
// same number means the same tensor.
struct PlanOp {
  bool pointwise = false;        // may join a tile group (caller checked op, layout, dtype)
  int64_t numel = 0;             // elements of every full-size operand
  // Row-local ops (layer norm, softmax over the last dim) and pointwise ops with operands
  // broadcast along rows need whole rows per tile: the row length; 0 for plain pointwise.
  int64_t row = 0;
  // Pointwise over per-row values (every full-size operand has a last size of 1, as a
  // keepdim reduction's result): may join a row group of numel * row elements, sliced by
  // rows. `numel` is then the per-row count.
  bool per_row = false;
  // Foreach ops (in place, or functional with an in-place sibling): every tensor argument
  // is a list of this many tensors, inputs list by list (element i of each list at
  // positions i, n + i, ...). Consecutive foreach ops over lists whose element i touches
  // only element i's tensors run tensor by tensor: all ops on tensor 0, then tensor 1...
  int64_t list = 0;
  trace::SmallVec<int64_t, 6> inputs;  // value ids; -1 for scalars and 0-dim operands
  trace::SmallVec<int64_t, 6> outputs;  // value ids of fresh outputs
  trace::SmallVec<bool, 4> alive;       // per output: still referenced after the segment
  int64_t out_bytes = 0;                // bytes of its fresh outputs (held until it runs)
};

struct Step {
  enum Kind : uint8_t { kExtern, kTileGroup, kForeachGroup } kind = kExtern;
  uint32_t first = 0;  // ops [first, first + count)
  uint32_t count = 1;
  // Tile groups: per op, per output: true when only a tile-sized scratch buffer is needed
  // (the value dies inside the group and nobody reads it later). Foreach groups: true for
  // a fresh output that dies inside the group (tier 1 still writes it; tier 2 need not).
  std::vector<std::vector<bool>> scratch;
  int64_t numel = 0;
  int64_t row = 0;  // tiles are whole rows of this length (0: any multiple of 64 elements)
  int64_t list = 0;  // foreach groups: tensors per list
};

// The default tile budget of tile groups (the policy's tile_bytes).
inline constexpr int64_t kDefaultTileBytes = int64_t{2} << 20;

struct Program {
  std::vector<Step> steps;
  uint32_t fused_ops = 0;        // ops inside tile and foreach groups
  uint32_t scratch_values = 0;   // intermediates never written to device memory
  int64_t tile_bytes = kDefaultTileBytes;  // tile groups: one tile of every operand (policy)
};

// min_group: shorter runs stay per op; so do tile groups over fewer than min_elements
// elements (foreach groups are not affected: they save a work item per tensor).
// max_group_bytes (the policy's hold_bytes; 0: no bound): a tile group's fresh outputs
// total at most this many bytes, or it has two ops. Its ops are held, their outputs
// allocated, until the group completes: this bounds that memory whatever the segment's
// length (how far the host runs ahead). A group holding a sixteenth of it also ends
// before an op that reads none of its values (an independent chain: a next iteration).
Program plan(const std::vector<PlanOp>& ops, uint32_t min_group, uint64_t min_elements = 0,
             uint64_t max_group_bytes = 0);

// Elements per tile for a group whose ops touch `operands` distinct full-size arrays of
// `element_bytes`-byte elements: sized so one tile of every operand fits in `budget`
// bytes (the policy's tile_bytes, 2 MiB by default: a slice of L3, since each kernel call
// costs microseconds and L2-sized tiles lose more in calls than they save), a multiple
// of 64.
int64_t tile_elements(int64_t operands, int64_t element_bytes, int64_t budget = kDefaultTileBytes);

}  // namespace neuron::fusion
