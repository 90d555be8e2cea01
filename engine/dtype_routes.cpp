// Accelerator dtype parity: op/dtype pairs CUDA supports and ATen's CPU kernels do not.
// Each route gives CUDA's result on neuron; every other dtype goes to the fallback as before.
// tests/python/test_dtype_parity.py lists every such pair of OpInfo and what covers it.
#include <ATen/native/Resize.h>
#include <ATen/ops/empty.h>

#include <algorithm>

#include "engine/dispatch.h"
#include "engine/pch.h"

namespace neuron::engine {
namespace {

using torch::jit::Stack;

c10::IValue& arg(Stack* stack, const c10::OperatorHandle& op, size_t i) {
  return (*stack)[stack->size() - op.schema().arguments().size() + i];
}

bool is_histc_integral(c10::ScalarType t) {
  // CUDA's histc dispatches AT_DISPATCH_ALL_TYPES: these integers, float and double.
  return t == c10::kByte || t == c10::kChar || t == c10::kShort || t == c10::kInt ||
         t == c10::kLong;
}

// CUDA's integer histc (SummaryOps.cu): bounds in the input type (the scalars truncated),
// the data's min/max when min == max, widened by one each way when still equal; a value in
// [lo, hi] goes to bin (int)((v - lo) * bins / (hi - lo)) computed in int64, the last bin
// closed; counts in the input type.
template <typename T>
void histc_count(const at::Tensor& self, int64_t bins, const c10::Scalar& min,
                 const c10::Scalar& max, const at::Tensor& out) {
  const int64_t min_arg = min.to<int64_t>();
  const int64_t max_arg = max.to<int64_t>();
  T lo = static_cast<T>(min_arg);
  T hi = static_cast<T>(max_arg);
  const at::Tensor x = self.contiguous();
  const T* data = x.const_data_ptr<T>();
  const int64_t n = x.numel();
  if (min_arg == max_arg && n > 0) {
    const auto [low, high] = std::minmax_element(data, data + n);
    lo = *low;
    hi = *high;
  }
  if (lo == hi) {
    lo = static_cast<T>(lo - 1);
    hi = static_cast<T>(hi + 1);
  }
  TORCH_CHECK(lo < hi, "histc: max must be larger than min");
  T* counts = out.data_ptr<T>();
  std::fill(counts, counts + bins, T(0));
  const int64_t lo64 = lo;
  const int64_t hi64 = hi;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = data[i];
    if (v < lo64 || v > hi64) continue;
    int64_t bin = static_cast<int>((v - lo64) * bins / (hi64 - lo64));
    if (bin == bins) bin -= 1;
    counts[bin] = static_cast<T>(counts[bin] + 1);
  }
}

// neuron::histc_int's CPU kernel: the worker runs it on aliases of device memory.
at::Tensor histc_int_cpu(const at::Tensor& self, int64_t bins, const c10::Scalar& min,
                         const c10::Scalar& max) {
  TORCH_CHECK(bins > 0, "histc: bins must be > 0");
  at::Tensor out = at::empty({bins}, self.options());
  AT_DISPATCH_INTEGRAL_TYPES(self.scalar_type(), "histc_int", [&] {
    histc_count<scalar_t>(self, bins, min, max, out);
  });
  return out;
}

at::Tensor histc_int_meta(const at::Tensor& self, int64_t bins, const c10::Scalar& min,
                          const c10::Scalar& max) {
  TORCH_CHECK(bins > 0, "histc: bins must be > 0");
  TORCH_CHECK(min.to<int64_t>() <= max.to<int64_t>(), "histc: max must be larger than min");
  return at::empty({bins}, self.options());
}

void histc_route(const c10::OperatorHandle& op, Stack* stack) {
  static const c10::OperatorHandle integral =
      c10::Dispatcher::singleton().findSchemaOrThrow("neuron::histc_int", "");
  if (is_histc_integral(arg(stack, op, 0).toTensor().scalar_type()))
    return neuron_fallback(integral, stack);
  neuron_fallback(op, stack);
}

// histc.out: CUDA computes the functional result and copies it into `out`.
void histc_out_route(const c10::OperatorHandle& op, Stack* stack) {
  const at::Tensor self = arg(stack, op, 0).toTensor();
  if (!is_histc_integral(self.scalar_type())) return neuron_fallback(op, stack);
  at::Tensor out = arg(stack, op, 4).toTensor();
  at::Tensor result = at::histc(self, arg(stack, op, 1).toInt(), arg(stack, op, 2).toScalar(),
                                arg(stack, op, 3).toScalar());
  at::native::resize_output(out, result.sizes());
  out.copy_(result);
  torch::jit::drop(*stack, 5);
  stack->emplace_back(std::move(out));
}

// Ops whose CUDA kernels take half and bfloat16 and accumulate in float: the same op on
// float32 copies, its floating results rounded back, is the result CUDA defines.
void float_route(const c10::OperatorHandle& op, Stack* stack) {
  const size_t n = op.schema().arguments().size();
  std::optional<c10::ScalarType> reduced;
  for (size_t i = 0; i < n && !reduced; ++i) {
    const c10::IValue& v = arg(stack, op, i);
    if (v.isTensor() && v.toTensor().defined() && at::isReducedFloatingType(v.toTensor().scalar_type()))
      reduced = v.toTensor().scalar_type();
  }
  if (!reduced) return neuron_fallback(op, stack);
  for (size_t i = 0; i < n; ++i) {
    c10::IValue& v = arg(stack, op, i);
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().scalar_type() == *reduced)
      v = v.toTensor().to(c10::kFloat);
  }
  neuron_fallback(op, stack);
  const size_t r = op.schema().returns().size();
  for (size_t i = stack->size() - r; i < stack->size(); ++i) {
    c10::IValue& v = (*stack)[i];
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().scalar_type() == c10::kFloat)
      v = v.toTensor().to(*reduced);
  }
}

// abs of a bool is the bool itself (CUDA's abs kernel dispatches bool as a copy).
void abs_out_route(const c10::OperatorHandle& op, Stack* stack) {
  const at::Tensor self = arg(stack, op, 0).toTensor();
  if (self.scalar_type() != c10::kBool) return neuron_fallback(op, stack);
  at::Tensor out = arg(stack, op, 1).toTensor();
  at::native::resize_output(out, self.sizes());
  out.copy_(self);
  torch::jit::drop(*stack, 2);
  stack->emplace_back(std::move(out));
}

// CUDA's trace of a bool matrix sums its diagonal (int64, as sum promotes bools).
void trace_route(const c10::OperatorHandle& op, Stack* stack) {
  const at::Tensor self = arg(stack, op, 0).toTensor();
  if (self.scalar_type() != c10::kBool) return neuron_fallback(op, stack);
  TORCH_CHECK(self.dim() == 2, "trace: expected a matrix, but got tensor with dim ", self.dim());
  at::Tensor result = self.diagonal().sum();
  torch::jit::drop(*stack, 1);
  stack->emplace_back(std::move(result));
}

// CUDA's nansum takes complex inputs: a value with a NaN part counts as zero.
void nansum_route(const c10::OperatorHandle& op, Stack* stack) {
  const at::Tensor self = arg(stack, op, 0).toTensor();
  if (!self.is_complex()) return neuron_fallback(op, stack);
  const auto dim = arg(stack, op, 1).toOptional<std::vector<int64_t>>();
  const bool keepdim = arg(stack, op, 2).toBool();
  const auto dtype = arg(stack, op, 3).toOptional<c10::ScalarType>();
  at::Tensor zeroed = self.masked_fill(self.isnan(), 0);
  at::Tensor result = dim ? at::sum(zeroed, at::OptionalIntArrayRef(*dim), keepdim, dtype)
                          : at::sum(zeroed, at::OptionalIntArrayRef(), keepdim, dtype);
  torch::jit::drop(*stack, 4);
  stack->emplace_back(std::move(result));
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(neuron, m) {
  m.def("histc_int(Tensor self, int bins=100, Scalar min=0, Scalar max=0) -> Tensor");
}

TORCH_LIBRARY_IMPL(neuron, CPU, m) { m.impl("histc_int", TORCH_FN(histc_int_cpu)); }
TORCH_LIBRARY_IMPL(neuron, Meta, m) { m.impl("histc_int", TORCH_FN(histc_int_meta)); }

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("histc", torch::CppFunction::makeFromBoxedFunction<&histc_route>());
  m.impl("histc.out", torch::CppFunction::makeFromBoxedFunction<&histc_out_route>());
  for (const char* name : {"avg_pool3d", "avg_pool3d_backward", "_upsample_bilinear2d_aa",
                           "_upsample_bilinear2d_aa_backward", "multi_margin_loss",
                           "multi_margin_loss_backward", "multilabel_margin_loss_forward",
                           "multilabel_margin_loss_backward"})
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&float_route>());
  m.impl("abs.out", torch::CppFunction::makeFromBoxedFunction<&abs_out_route>());
  m.impl("trace", torch::CppFunction::makeFromBoxedFunction<&trace_route>());
  m.impl("nansum", torch::CppFunction::makeFromBoxedFunction<&nansum_route>());
}

}  // namespace neuron::engine
