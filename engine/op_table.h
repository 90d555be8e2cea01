// What the engine knows about each op schema, computed once: interned id, how each
// return relates to the arguments, which arguments are written, and the out= variant
// the worker can call to write straight into device memory.
#pragma once

#include <atomic>
#include <optional>
#include <string>
#include <vector>

#include "backend/op_work.h"
#include "engine/pch.h"
#include "trace/op_record.h"

namespace neuron::engine {

struct FastMeta;

// How an op may join a fused group, by its name alone (fusible.cpp); the operands of
// each call decide the rest.
enum class FusibleKind : uint8_t {
  kNone,        // never in a group (it may still be an extern step)
  kPointwise,   // a builtin pointwise op: same-shape or row-broadcast operands
  kLayerNorm,   // native_layer_norm over the last dim
  kSoftmax,     // _softmax / _log_softmax over the last dim
  kReduction,   // keepdim sum/mean/amax/amin/var over the last dim
};

struct ReturnInfo {
  enum Kind : uint8_t { kNew, kView, kInplace, kNonTensor } kind = kNew;
  bool is_list = false;
  int alias_arg = -1;  // the argument a view or in-place return aliases
};

struct OpInfo {
  trace::OpId id = 0;
  std::string name;
  uint64_t kind = 0;                    // hash of name (trace::SegmentOp::kind)
  std::vector<ReturnInfo> returns;
  std::vector<int> write_args;          // arguments annotated as written (Tensor(a!))
  std::vector<bool> arg_is_out;         // per argument: a kwarg-only out= tensor
  std::vector<bool> arg_is_opt_list;    // per argument: Tensor?[]
  std::vector<bool> arg_is_liftable;    // per argument: a Scalar or float value
  bool foreach = false;                 // aten::_foreach_*: scalar values never decide shapes
  bool needs_work = true;               // false for pure views: nothing to execute
  // How the op's bits depend on the worker's intra-op thread count.
  backend::ThreadRule threads = backend::ThreadRule::kFixed;
  FusibleKind fusible = FusibleKind::kNone;
  uint8_t reduction_dims_arg = 0;   // kReduction: the dim-list argument
  uint8_t reduction_keepdim_arg = 0;  // kReduction: the keepdim argument
  std::optional<c10::OperatorHandle> out_variant;
  const FastMeta* fast_meta = nullptr;  // output geometry in C++ (engine/fast_meta.h)
  // Functional foreach ops: the in-place sibling (_foreach_sqrt -> _foreach_sqrt_), run on
  // the outputs after copying the inputs there (their out= kernels allocate and copy).
  std::optional<c10::OperatorHandle> foreach_inplace;
  std::atomic<bool> out_refused{false};  // the worker saw the out variant fail
  // The CPU kernel lays outputs out in ways the Meta kernel does not predict (FFTs,
  // LAPACK results): the first call per input geometry runs at once and the shape cache
  // keeps the CPU's output geometry, so later calls with that geometry queue.
  bool layout_from_cpu = false;
  // Ops that must run at once on the caller's thread, with the reason.
  std::atomic<bool> synchronous{false};
  std::string synchronous_reason;
};

OpInfo& op_info(const c10::OperatorHandle& op);
// The thread rule of an op by name (fusible.cpp, next to the pointwise op list).
backend::ThreadRule thread_rule_of(const std::string& name);
// Sets info.fusible and its reduction arguments from info.name (fusible.cpp).
void classify_fusible(OpInfo& info);
// Marks an op synchronous from now on (no meta kernel, for instance).
void mark_synchronous(OpInfo& info, std::string reason);

}  // namespace neuron::engine
