// Which ops may join fused groups, and how: the planner's view of one recorded op
// (pointwise ops over one shape, row-local ops and reductions over the last dim with the
// ops on their per-row results, foreach ops that may run tensor by tensor).
#include <algorithm>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "backend/op_work.h"
#include "engine/engine.h"
#include "engine/recording.h"
#include "engine/stream_state.h"

namespace neuron::engine {
namespace {

// Pointwise ops whose out= kernels may run on tiles of contiguous same-shape operands.
const std::unordered_set<std::string>& builtin_pointwise() {
  static const std::unordered_set<std::string> ops = {
      "aten::add.Tensor", "aten::sub.Tensor", "aten::mul.Tensor", "aten::div.Tensor",
      "aten::div.Tensor_mode", "aten::add.Scalar", "aten::mul.Scalar", "aten::neg",
      "aten::exp", "aten::log", "aten::tanh", "aten::sigmoid", "aten::gelu", "aten::silu",
      "aten::abs", "aten::sqrt", "aten::rsqrt", "aten::reciprocal", "aten::sin", "aten::cos",
      "aten::erf", "aten::log1p", "aten::expm1", "aten::pow.Tensor_Scalar",
      "aten::pow.Tensor_Tensor", "aten::maximum", "aten::minimum", "aten::where.self",
      "aten::clamp", "aten::clamp_min", "aten::clamp_max", "aten::addcmul", "aten::addcdiv",
      "aten::lerp.Scalar", "aten::lerp.Tensor", "aten::eq.Tensor", "aten::ne.Tensor",
      "aten::lt.Tensor", "aten::le.Tensor", "aten::gt.Tensor", "aten::ge.Tensor",
      "aten::eq.Scalar", "aten::ne.Scalar", "aten::lt.Scalar", "aten::le.Scalar",
      "aten::gt.Scalar", "aten::ge.Scalar", "aten::threshold_backward", "aten::gelu_backward",
      "aten::sigmoid_backward", "aten::tanh_backward", "aten::silu_backward",
      "aten::leaky_relu", "aten::hardtanh", "aten::softplus", "aten::sign",
      "aten::logical_and", "aten::logical_or", "aten::logical_not", "aten::rsub.Tensor",
      "aten::rsub.Scalar", "aten::_to_copy"};
  return ops;
}

bool is_contiguous(const trace::TensorMeta& m) { return backend::contiguous(m); }

bool same_sizes(const trace::TensorMeta& a, const trace::TensorMeta& b) {
  if (a.ndim != b.ndim) return false;
  for (int i = 0; i < a.ndim; ++i)
    if (a.sizes[i] != b.sizes[i]) return false;
  return true;
}


bool plain(const trace::TensorMeta& m) {
  return m.device >= 0 && is_contiguous(m) && m.flags == 0 && m.storage_offset == 0;
}

// Operand broadcast along rows of out: shape (1, ..., 1, C) or (C), C = out's last size.
bool row_broadcast(const trace::TensorMeta& m, const trace::TensorMeta& out) {
  if (out.ndim < 2 || m.ndim > out.ndim || !plain(m)) return false;
  const int64_t c = out.sizes[out.ndim - 1];
  if (m.sizes[m.ndim - 1] != c || c <= 1) return false;
  for (int i = 0; i + 1 < m.ndim; ++i)
    if (m.sizes[i] != 1) return false;
  return true;
}

// Operand with one value per row of out: out's sizes with a last size of 1.
bool per_row_operand(const trace::TensorMeta& m, const trace::TensorMeta& out) {
  if (out.ndim < 2 || m.ndim != out.ndim || !plain(m)) return false;
  if (m.sizes[m.ndim - 1] != 1 || out.sizes[out.ndim - 1] <= 1) return false;
  for (int i = 0; i + 1 < m.ndim; ++i)
    if (m.sizes[i] != out.sizes[i]) return false;
  return true;
}

// Ops that are independent per row of their last dim: they may join a tile group whose
// tiles are whole rows. (ATen computes each row on its own, so a tile gives the bits the
// whole tensor gives.)
fusion::PlanOp row_op(backend::OpWork& work, const OpInfo& info, fusion::PlanOp p) {
  const auto& in = work.record.tensors.empty() ? trace::TensorMeta{} : work.record.tensors[0];
  if (!in.defined || in.ndim < 2 || !plain(in)) return p;
  const int64_t c = in.sizes[in.ndim - 1];
  const int64_t n = in.numel();
  if (c <= 0 || n <= 0) return p;
  for (const auto& m : work.output_metas) {
    if (!m.defined || !is_contiguous(m)) return p;
    // out, or per-row stats (last size 1)
    if (m.numel() != n && !(m.numel() * c == n && m.sizes[m.ndim - 1] == 1)) return p;
  }
  if (info.fusible == FusibleKind::kReduction) {
    // A reduction over the last dim with keepdim (its per-row result has a last size of
    // 1), no dtype change: each row reduces on its own (rows are split across threads,
    // never a row), so a tile of whole rows gives the bits the whole tensor gives.
    const size_t d = info.reduction_dims_arg;
    if (c < 2 || n / c < 2 || work.output_metas.size() != 1) return p;
    const auto& out = work.output_metas[0];
    if (out.ndim != in.ndim || out.sizes[out.ndim - 1] != 1 || out.dtype != in.dtype) return p;
    if (work.slots.size() <= d + 1 || !work.values[d].isIntList()) return p;
    const auto dims = work.values[d].toIntList();
    if (dims.size() != 1 || (dims.get(0) != -1 && dims.get(0) != in.ndim - 1)) return p;
    const size_t keepdim = info.reduction_keepdim_arg;
    if (keepdim >= work.values.size() || !work.values[keepdim].isBool() || !work.values[keepdim].toBool())
      return p;
    for (size_t k = keepdim + 1; k < work.values.size(); ++k)
      if (work.slots[k].kind == backend::SlotKind::kValue && !work.values[k].isNone()) return p;  // dtype=
    // Tiles are [rows, C]: the last dim is -1 there, whatever the tensor's rank.
    if (dims.get(0) != -1) work.values[d] = c10::IValue(std::vector<int64_t>{-1});
  } else if (info.fusible == FusibleKind::kLayerNorm) {
    // normalized_shape = [C]; weight and bias [C] or absent.
    if (work.slots.size() < 5 || work.slots[1].kind != backend::SlotKind::kValue) return p;
    const c10::IValue& shape = work.values[1];
    if (!shape.isIntList() || shape.toIntList().size() != 1 || shape.toIntList().get(0) != c) return p;
    for (size_t k = 1; k < work.record.tensors.size(); ++k) {
      const auto& m = work.record.tensors[k];
      if (m.defined && (!plain(m) || m.numel() != c)) return p;
    }
  } else {
    // _softmax / _log_softmax(self, dim, half_to_float) over the last dim.
    if (work.slots.size() < 2 || !work.values[1].isInt()) return p;
    const int64_t dim = work.values[1].toInt();
    if (dim != -1 && dim != in.ndim - 1) return p;
    if (work.output_metas.size() != 1 || work.output_metas[0].numel() != n) return p;
    work.values[1] = c10::IValue(int64_t{-1});  // tiles are [rows, C]
  }
  p.pointwise = true;
  p.numel = n;
  p.row = c;
  return p;
}

// Foreach ops that may run tensor by tensor: in place, or functional with the in-place
// sibling the worker runs on its outputs; every tensor argument a list of one length,
// every value a number, None, or one number per tensor.
fusion::PlanOp foreach_op(const backend::OpWork& work, const OpInfo& info, fusion::PlanOp p) {
  const bool in_place = info.write_args.size() == 1 && info.write_args[0] == 0 && work.output_metas.empty();
  if (!in_place && !work.inplace_op) return p;
  int64_t n = -1;
  for (size_t k = 0; k < work.slots.size(); ++k) {
    const auto& slot = work.slots[k];
    if (slot.kind == backend::SlotKind::kTensorList) {
      if (n >= 0 && slot.count != n) return p;
      n = slot.count;
    } else if (slot.kind != backend::SlotKind::kValue) {
      return p;
    }
  }
  if (n < 2) return p;
  for (size_t k = 0; k < work.slots.size(); ++k) {
    if (work.slots[k].kind != backend::SlotKind::kValue) continue;
    const c10::IValue& v = work.values[k];
    if (v.isList() ? v.toListRef().size() != static_cast<size_t>(n) : !(v.isNone() || v.isDouble() || v.isInt() || v.isScalar()))
      return p;
  }
  p.inputs.clear();
  for (size_t k = 0; k < work.record.tensors.size(); ++k) {
    const auto& m = work.record.tensors[k];
    if (!m.defined || m.device < 0 || !work.inputs[k].storage) return p;  // host tensors
    p.inputs.push_back(static_cast<int64_t>(m.storage));
  }
  p.list = n;
  return p;
}

}  // namespace

fusion::PlanOp plan_op_of(backend::OpWork& work, const OpInfo& info) {
  fusion::PlanOp p;
  for (const auto& b : work.output_storages) p.out_bytes += static_cast<int64_t>(b.nbytes);
  for (const auto& m : work.record.tensors)
    p.inputs.push_back(m.defined && m.device >= 0 && m.ndim > 0 ? static_cast<int64_t>(m.storage) : -1);
  if (info.foreach) return foreach_op(work, info, std::move(p));
  if (!work.out_op || !info.write_args.empty()) return p;
  for (size_t k = 0; k < work.slots.size(); ++k)
    if (work.slots[k].kind != backend::SlotKind::kValue &&
        work.slots[k].kind != backend::SlotKind::kTensor)
      return p;
  // A policy's own op list replaces the builtin pointwise list (rare: read it only then).
  const bool listed = active_policy_lists_ops();
  if (listed) {
    const fusion::Policy policy = active_policy();
    const auto& ops = policy.fusible_ops;
    if (std::find(ops.begin(), ops.end(), info.name) == ops.end()) return p;
  }
  if (info.fusible == FusibleKind::kLayerNorm || info.fusible == FusibleKind::kSoftmax ||
      info.fusible == FusibleKind::kReduction)
    return row_op(work, info, std::move(p));
  if (work.output_metas.size() != 1) return p;
  const auto& out = work.output_metas[0];
  if (!out.defined || !is_contiguous(out)) return p;
  if (!listed && info.fusible != FusibleKind::kPointwise) return p;
  int64_t row = 0;
  for (size_t k = 0; k < work.record.tensors.size(); ++k) {
    const auto& m = work.record.tensors[k];
    if (!m.defined || m.ndim == 0) continue;  // scalars broadcast by the kernel itself
    if (same_sizes(m, out) && plain(m)) continue;
    // A bias or scale along rows, or one value per row (a norm's statistics): whole rows.
    if (!row_broadcast(m, out) && !per_row_operand(m, out)) return p;
    row = out.sizes[out.ndim - 1];
  }
  p.pointwise = true;
  p.numel = out.numel();
  p.row = row;
  // Over per-row values only: may run on row slices inside a row group.
  p.per_row = row == 0 && out.ndim >= 2 && out.sizes[out.ndim - 1] == 1;
  return p;
}

void classify_fusible(OpInfo& info) {
  // Reductions that may join row groups, with their dim-list and keepdim arguments.
  static const std::unordered_map<std::string, std::pair<uint8_t, uint8_t>> reductions = {
      {"aten::sum.dim_IntList", {1, 2}}, {"aten::mean.dim", {1, 2}}, {"aten::amax", {1, 2}},
      {"aten::amin", {1, 2}}, {"aten::var.correction", {1, 3}}};
  const std::string& name = info.name;
  if (auto it = reductions.find(name); it != reductions.end()) {
    info.fusible = FusibleKind::kReduction;
    info.reduction_dims_arg = it->second.first;
    info.reduction_keepdim_arg = it->second.second;
  } else if (name == "aten::native_layer_norm") {
    info.fusible = FusibleKind::kLayerNorm;
  } else if (name == "aten::_softmax" || name == "aten::_log_softmax") {
    info.fusible = FusibleKind::kSoftmax;
  } else if (builtin_pointwise().count(name)) {
    info.fusible = FusibleKind::kPointwise;
  } else {
    info.fusible = FusibleKind::kNone;
  }
}

backend::ThreadRule thread_rule_of(const std::string& name) {
  using backend::ThreadRule;
  // nll_loss_backward writes each sample's gradient on its own (ATen splits the batch).
  if (name == "aten::native_layer_norm" || name == "aten::nll_loss_backward") return ThreadRule::kFree;
  // log_softmax's backward over the last dim: one row per thread, as forward. Not
  // softmax's: on torch 2.13 a 1000x333 one differs in its last bits between 1 and 2
  // threads. Checked on CPU eager, 1 against 2 threads, 280 shapes up to 20000x4097:
  // every _log_softmax_backward_data and nll_loss_backward (all reductions) bit-equal.
  // mlp_train's 64x10 ones: 20 -> 2.5 us (nll_loss_backward), 23 -> 5 us on the worker.
  if (name == "aten::_softmax" || name == "aten::_log_softmax" || name == "aten::_log_softmax_backward_data")
    return ThreadRule::kRowLastDim;
  if (name == "aten::mm" || name == "aten::addmm" || name == "aten::bmm" || name == "aten::baddbmm" ||
      name == "aten::mv" || name == "aten::addmv")
    return ThreadRule::kMatmul;
  if (name == "aten::sum.dim_IntList" || name == "aten::mean.dim") return ThreadRule::kReduction;
  if (name == "aten::copy_" || name == "aten::fill_.Scalar" || name == "aten::zero_")
    return ThreadRule::kElementwise;
  if (name.rfind("aten::_foreach_", 0) == 0)  // pointwise per tensor, but for the reductions
    return name.rfind("aten::_foreach_norm", 0) == 0 || name.rfind("aten::_foreach_max", 0) == 0
               ? ThreadRule::kFixed
               : ThreadRule::kElementwise;
  if (builtin_pointwise().count(name)) return ThreadRule::kElementwise;
  // In-place variants: aten::add_.Tensor is aten::add.Tensor's kernel.
  const auto dot = name.find('.');
  const auto base = name.substr(0, dot);
  if (base.size() > 1 && base.back() == '_') {
    std::string functional = base.substr(0, base.size() - 1);
    if (dot != std::string::npos) functional += name.substr(dot);
    if (builtin_pointwise().count(functional)) return ThreadRule::kElementwise;
  }
  return ThreadRule::kFixed;
}

}  // namespace neuron::engine
