#include "engine/fast_meta.h"

#include <ATen/ExpandUtils.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/core/op_registration/op_registration.h>
#include <ATen/ops/_log_softmax_backward_data_meta_dispatch.h>
#include <ATen/ops/_log_softmax_meta_dispatch.h>
#include <ATen/ops/_softmax_backward_data_meta_dispatch.h>
#include <ATen/ops/_softmax_meta_dispatch.h>
#include <ATen/ops/add_meta_dispatch.h>
#include <ATen/ops/addcdiv_meta_dispatch.h>
#include <ATen/ops/addcmul_meta_dispatch.h>
#include <ATen/ops/addmm_meta_dispatch.h>
#include <ATen/ops/amax_meta_dispatch.h>
#include <ATen/ops/argmax_meta_dispatch.h>
#include <ATen/ops/baddbmm_meta_dispatch.h>
#include <ATen/ops/bitwise_and_meta_dispatch.h>
#include <ATen/ops/bitwise_not_meta_dispatch.h>
#include <ATen/ops/bitwise_or_meta_dispatch.h>
#include <ATen/ops/bmm_meta_dispatch.h>
#include <ATen/ops/cat_meta_dispatch.h>
#include <ATen/ops/clamp_meta_dispatch.h>
#include <ATen/ops/clamp_min_meta_dispatch.h>
#include <ATen/ops/cos_meta_dispatch.h>
#include <ATen/ops/cumsum_meta_dispatch.h>
#include <ATen/ops/div_meta_dispatch.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/eq_meta_dispatch.h>
#include <ATen/ops/exp_meta_dispatch.h>
#include <ATen/ops/ge_meta_dispatch.h>
#include <ATen/ops/gelu_backward_meta_dispatch.h>
#include <ATen/ops/gelu_meta_dispatch.h>
#include <ATen/ops/gt_meta_dispatch.h>
#include <ATen/ops/le_meta_dispatch.h>
#include <ATen/ops/lerp_meta_dispatch.h>
#include <ATen/ops/log_meta_dispatch.h>
#include <ATen/ops/lt_meta_dispatch.h>
#include <ATen/ops/maximum_meta_dispatch.h>
#include <ATen/ops/mean_meta_dispatch.h>
#include <ATen/ops/minimum_meta_dispatch.h>
#include <ATen/ops/mm_meta_dispatch.h>
#include <ATen/ops/mul_meta_dispatch.h>
#include <ATen/ops/ne_meta_dispatch.h>
#include <ATen/ops/neg_meta_dispatch.h>
#include <ATen/ops/nll_loss_backward_meta_dispatch.h>
#include <ATen/ops/nll_loss_forward_meta_dispatch.h>
#include <ATen/ops/pow_meta_dispatch.h>
#include <ATen/ops/reciprocal_meta_dispatch.h>
#include <ATen/ops/rsqrt_meta_dispatch.h>
#include <ATen/ops/sigmoid_backward_meta_dispatch.h>
#include <ATen/ops/sigmoid_meta_dispatch.h>
#include <ATen/ops/silu_backward_meta_dispatch.h>
#include <ATen/ops/silu_meta_dispatch.h>
#include <ATen/ops/sin_meta_dispatch.h>
#include <ATen/ops/sqrt_meta_dispatch.h>
#include <ATen/ops/sub_meta_dispatch.h>
#include <ATen/ops/sum_meta_dispatch.h>
#include <ATen/ops/tanh_backward_meta_dispatch.h>
#include <ATen/ops/tanh_meta_dispatch.h>
#include <ATen/ops/threshold_backward_meta_dispatch.h>

#include <unordered_map>

namespace neuron::engine {

struct FastMeta {
  c10::KernelFunction kernel;                     // an at::meta:: function, boxed
  bool (*rule)(torch::jit::Stack&) = nullptr;     // or a rule of ours
};

namespace {

using at::Scalar;
using at::Tensor;

// Output geometry only: the CPU kernel computes the values (and the Meta kernel's argument
// checks still run wherever a rule declines the case).
Tensor contiguous_like(const Tensor& t) {
  return at::empty(t.sizes(), t.options());
}

// native_layer_norm(input, normalized_shape, weight?, bias?, eps) -> (out, mean, rstd), as
// the CPU kernel lays them out: out contiguous like input; mean and rstd of shape
// input.shape[:axis] + [1] * len(normalized_shape). Only where weight and bias (if any)
// have the input's dtype and shape (mixed dtypes change the statistics' dtype).
bool layer_norm_rule(torch::jit::Stack& stack) {
  const size_t base = stack.size() - 5;
  const Tensor input = stack[base].toTensor();
  const auto normalized = stack[base + 1].toIntList().vec();
  const auto n = static_cast<int64_t>(normalized.size());
  if (n == 0 || input.dim() < n) return false;
  for (int64_t i = 0; i < n; ++i)
    if (input.size(input.dim() - n + i) != normalized[static_cast<size_t>(i)]) return false;
  for (size_t k : {base + 2, base + 3}) {
    if (stack[k].isNone()) continue;
    const Tensor p = stack[k].toTensor();
    if (!p.defined()) continue;
    if (p.scalar_type() != input.scalar_type() || p.sizes() != c10::IntArrayRef(normalized)) return false;
  }
  std::vector<int64_t> stat(input.sizes().begin(), input.sizes().end());
  for (int64_t i = input.dim() - n; i < input.dim(); ++i) stat[static_cast<size_t>(i)] = 1;
  const auto opts = input.options();
  Tensor out = contiguous_like(input);
  Tensor mean = at::empty(stat, opts);
  Tensor rstd = at::empty(stat, opts);
  torch::jit::drop(stack, 5);
  torch::jit::push(stack, std::move(out), std::move(mean), std::move(rstd));
  return true;
}

// native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight?, bias?,
// output_mask) -> (grad_input?, grad_weight?, grad_bias?): each contiguous like its input.
bool layer_norm_backward_rule(torch::jit::Stack& stack) {
  const size_t base = stack.size() - 8;
  const Tensor grad = stack[base].toTensor();
  const Tensor input = stack[base + 1].toTensor();
  if (!grad.defined() || grad.sizes() != input.sizes()) return false;
  const auto mask = stack[base + 7].toBoolList();
  if (mask.size() != 3) return false;
  Tensor outs[3];
  if (mask[0]) outs[0] = contiguous_like(input);
  for (int k = 1; k < 3; ++k) {
    if (!mask[k]) continue;
    const c10::IValue& v = stack[base + 4 + static_cast<size_t>(k)];
    if (v.isNone() || !v.toTensor().defined()) return false;
    outs[k] = contiguous_like(v.toTensor());
  }
  torch::jit::drop(stack, 8);
  torch::jit::push(stack, std::move(outs[0]), std::move(outs[1]), std::move(outs[2]));
  return true;
}

// zero_(self) and fill_.Scalar(self, value) -> self: nothing to check, geometry unchanged.
template <size_t kArgs>
bool returns_self_rule(torch::jit::Stack& stack) {
  c10::IValue self = stack[stack.size() - kArgs];
  torch::jit::drop(stack, kArgs);
  torch::jit::push(stack, std::move(self));
  return true;
}

// abs.out(self, out) -> out, the form aten::abs reaches the device in (abs is composite:
// a fresh empty out, then abs_out). For a real, non-bool self and a fresh (empty) out of
// its dtype, TensorIterator's unary_op lays the out out as neg's structured meta does; a
// Python Meta kernel took 0.2-1.3 ms a call, at every new shape. Other cases (complex to
// float, out= of another shape or dtype) go to the Meta kernel.
bool abs_out_rule(torch::jit::Stack& stack) {
  const size_t base = stack.size() - 2;
  const Tensor self = stack[base].toTensor();
  Tensor out = stack[base + 1].toTensor();
  if (!self.defined() || !out.defined() || self.is_complex() || self.scalar_type() == at::kBool ||
      out.scalar_type() != self.scalar_type() || out.numel() != 0 || out.device() != self.device())
    return false;
  const Tensor like = at::meta::neg(self);
  out.resize_(like.sizes());
  out.as_strided_(like.sizes(), like.strides());
  c10::IValue result = stack[base + 1];
  torch::jit::drop(stack, 2);
  torch::jit::push(stack, std::move(result));
  return true;
}

// copy_(self, src, non_blocking) -> self: geometry unchanged. Only where src broadcasts to
// self and self has no internal overlap; anything else goes to the Meta kernel, which
// raises as CPU eager would.
bool copy_rule(torch::jit::Stack& stack) {
  const size_t base = stack.size() - 3;
  const Tensor self = stack[base].toTensor();
  const Tensor src = stack[base + 1].toTensor();
  if (!self.defined() || !src.defined() || !at::is_expandable_to(src.sizes(), self.sizes()) ||
      at::has_internal_overlap(self) == at::MemOverlap::Yes)
    return false;
  c10::IValue result = stack[base];
  torch::jit::drop(stack, 3);
  torch::jit::push(stack, std::move(result));
  return true;
}

struct Table {
  std::unordered_map<std::string, FastMeta> entries;
  std::vector<std::string> mismatches;

  std::optional<c10::OperatorHandle> find(const std::string& name) {
    const auto dot = name.find('.');
    return c10::Dispatcher::singleton().findSchema(
        {name.substr(0, dot), dot == std::string::npos ? "" : name.substr(dot + 1)});
  }

  // An at::meta:: function, checked against the registered schema before it is used.
  template <class F>
  void add(const std::string& name, F* fn) {
    auto handle = find(name);
    if (!handle) return;  // not in this build of torch
    auto inferred = c10::detail::inferFunctionSchemaFromFunctor<c10::impl::WrapFunctionIntoRuntimeFunctor<F*>>();
    if (auto diff = c10::findSchemaDifferences(*inferred, handle->schema())) {
      mismatches.push_back(name + ": " + *diff);
      return;
    }
    entries[name].kernel = c10::KernelFunction::makeFromUnboxedRuntimeFunction(fn);
  }

  void add_rule(const std::string& name, bool (*rule)(torch::jit::Stack&)) {
    if (find(name)) entries[name].rule = rule;
  }
};

using Unary = Tensor(const Tensor&);
using UnaryInplace = Tensor&(Tensor&);
using Binary = Tensor(const Tensor&, const Tensor&);
using BinaryInplace = Tensor&(Tensor&, const Tensor&);
using BinaryAlpha = Tensor(const Tensor&, const Tensor&, const Scalar&);
using BinaryAlphaInplace = Tensor&(Tensor&, const Tensor&, const Scalar&);
using WithScalar = Tensor(const Tensor&, const Scalar&);
using WithScalarInplace = Tensor&(Tensor&, const Scalar&);
using Ternary = Tensor(const Tensor&, const Tensor&, const Tensor&, const Scalar&);
using TernaryInplace = Tensor&(Tensor&, const Tensor&, const Tensor&, const Scalar&);
using Reduction = Tensor(const Tensor&, at::OptionalIntArrayRef, bool, std::optional<at::ScalarType>);
using Softmax = Tensor(const Tensor&, int64_t, bool);
using SoftmaxBackward = Tensor(const Tensor&, const Tensor&, int64_t, at::ScalarType);

Table& table() {
  static Table* t = [] {
    auto* t = new Table();
    // Pointwise: each functional op and its in-place form.
#define NEURON_UNARY(op)                                             \
  t->add("aten::" #op, static_cast<Unary*>(&at::meta::op));          \
  t->add("aten::" #op "_", static_cast<UnaryInplace*>(&at::meta::op##_));
    NEURON_UNARY(sqrt) NEURON_UNARY(rsqrt) NEURON_UNARY(exp)
    NEURON_UNARY(log) NEURON_UNARY(tanh) NEURON_UNARY(sigmoid)
    NEURON_UNARY(neg) NEURON_UNARY(cos) NEURON_UNARY(sin)
    NEURON_UNARY(silu) NEURON_UNARY(reciprocal) NEURON_UNARY(bitwise_not)
#undef NEURON_UNARY
#define NEURON_BINARY(op, overload)                                           \
  t->add("aten::" #op "." #overload, static_cast<Binary*>(&at::meta::op));    \
  t->add("aten::" #op "_." #overload, static_cast<BinaryInplace*>(&at::meta::op##_));
    NEURON_BINARY(mul, Tensor) NEURON_BINARY(div, Tensor)
    NEURON_BINARY(bitwise_and, Tensor) NEURON_BINARY(bitwise_or, Tensor)
    NEURON_BINARY(pow, Tensor_Tensor) NEURON_BINARY(eq, Tensor)
    NEURON_BINARY(ne, Tensor) NEURON_BINARY(lt, Tensor) NEURON_BINARY(le, Tensor)
    NEURON_BINARY(gt, Tensor) NEURON_BINARY(ge, Tensor)
    NEURON_BINARY(clamp_min, Tensor)
#undef NEURON_BINARY
#define NEURON_SCALAR(op, overload)                                                \
  t->add("aten::" #op "." #overload, static_cast<WithScalar*>(&at::meta::op));     \
  t->add("aten::" #op "_." #overload, static_cast<WithScalarInplace*>(&at::meta::op##_));
    NEURON_SCALAR(pow, Tensor_Scalar) NEURON_SCALAR(eq, Scalar)
    NEURON_SCALAR(ne, Scalar) NEURON_SCALAR(lt, Scalar) NEURON_SCALAR(le, Scalar)
    NEURON_SCALAR(gt, Scalar) NEURON_SCALAR(ge, Scalar)
#undef NEURON_SCALAR
    t->add("aten::clamp_min", static_cast<WithScalar*>(&at::meta::clamp_min));
    t->add("aten::clamp_min_", static_cast<WithScalarInplace*>(&at::meta::clamp_min_));
    t->add("aten::add.Tensor", static_cast<BinaryAlpha*>(&at::meta::add));
    t->add("aten::add_.Tensor", static_cast<BinaryAlphaInplace*>(&at::meta::add_));
    t->add("aten::sub.Tensor", static_cast<BinaryAlpha*>(&at::meta::sub));
    t->add("aten::sub_.Tensor", static_cast<BinaryAlphaInplace*>(&at::meta::sub_));
    t->add("aten::lerp.Scalar", static_cast<BinaryAlpha*>(&at::meta::lerp));
    t->add("aten::lerp_.Scalar", static_cast<BinaryAlphaInplace*>(&at::meta::lerp_));
    t->add("aten::addcmul", static_cast<Ternary*>(&at::meta::addcmul));
    t->add("aten::addcmul_", static_cast<TernaryInplace*>(&at::meta::addcmul_));
    t->add("aten::addcdiv", static_cast<Ternary*>(&at::meta::addcdiv));
    t->add("aten::addcdiv_", static_cast<TernaryInplace*>(&at::meta::addcdiv_));
    t->add("aten::maximum", static_cast<Binary*>(&at::meta::maximum));
    t->add("aten::minimum", static_cast<Binary*>(&at::meta::minimum));
    t->add("aten::gelu", static_cast<Tensor (*)(const Tensor&, c10::string_view)>(&at::meta::gelu));
    t->add("aten::gelu_backward", &at::meta::gelu_backward);
    t->add("aten::silu_backward", &at::meta::silu_backward);
    t->add("aten::sigmoid_backward", &at::meta::sigmoid_backward);
    t->add("aten::tanh_backward", &at::meta::tanh_backward);
    t->add("aten::threshold_backward", &at::meta::threshold_backward);
    t->add("aten::clamp", static_cast<Tensor (*)(const Tensor&, const std::optional<Scalar>&,
                                             const std::optional<Scalar>&)>(&at::meta::clamp));
    // Matmuls, reductions, softmax, losses, cat.
    t->add("aten::mm", &at::meta::mm);
    t->add("aten::bmm", &at::meta::bmm);
    t->add("aten::addmm", static_cast<Tensor (*)(const Tensor&, const Tensor&, const Tensor&,
                                                 const Scalar&, const Scalar&)>(&at::meta::addmm));
    t->add("aten::baddbmm", static_cast<Tensor (*)(const Tensor&, const Tensor&, const Tensor&,
                                                   const Scalar&, const Scalar&)>(&at::meta::baddbmm));
    t->add("aten::sum.dim_IntList", static_cast<Reduction*>(&at::meta::sum));
    t->add("aten::mean.dim", static_cast<Reduction*>(&at::meta::mean));
    t->add("aten::amax", &at::meta::amax);
    t->add("aten::argmax", &at::meta::argmax);
    t->add("aten::cumsum", static_cast<Tensor (*)(const Tensor&, int64_t, std::optional<at::ScalarType>)>(
                               &at::meta::cumsum));
    t->add("aten::_log_softmax", static_cast<Softmax*>(&at::meta::_log_softmax));
    t->add("aten::_softmax", static_cast<Softmax*>(&at::meta::_softmax));
    t->add("aten::_log_softmax_backward_data", static_cast<SoftmaxBackward*>(&at::meta::_log_softmax_backward_data));
    t->add("aten::_softmax_backward_data", static_cast<SoftmaxBackward*>(&at::meta::_softmax_backward_data));
    t->add("aten::nll_loss_forward", &at::meta::nll_loss_forward);
    t->add("aten::nll_loss_backward", &at::meta::nll_loss_backward);
    t->add("aten::cat", static_cast<Tensor (*)(const at::ITensorListRef&, int64_t)>(&at::meta::cat));
    t->add_rule("aten::zero_", &returns_self_rule<1>);
    t->add_rule("aten::fill_.Scalar", &returns_self_rule<2>);
    t->add_rule("aten::abs.out", &abs_out_rule);
    t->add_rule("aten::copy_", &copy_rule);
    t->add_rule("aten::native_layer_norm", &layer_norm_rule);
    t->add_rule("aten::native_layer_norm_backward", &layer_norm_backward_rule);
    return t;
  }();
  return *t;
}

}  // namespace

const FastMeta* find_fast_meta(const std::string& name) {
  auto& entries = table().entries;
  auto it = entries.find(name);
  return it == entries.end() ? nullptr : &it->second;
}

bool run_fast_meta(const FastMeta& fast, const c10::OperatorHandle& op, torch::jit::Stack& stack) {
  if (fast.rule != nullptr) return fast.rule(stack);
  fast.kernel.callBoxed(op, c10::DispatchKeySet(c10::DispatchKey::Meta), &stack);
  return true;
}

std::vector<std::string> fast_meta_ops() {
  std::vector<std::string> names;
  for (const auto& [name, _] : table().entries) names.push_back(name);
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<std::string> fast_meta_mismatches() { return table().mismatches; }

}  // namespace neuron::engine
