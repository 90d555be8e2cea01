// ATen's DispatchStub calls into libtorch_cpu with one kernel pointer per instruction set
// the library was built with; the torch wheel has AVX2 and AVX-512 ones (nm), and the
// header declares that call from these macros.
#define HAVE_AVX512_CPU_DEFINITION
#define HAVE_AVX2_CPU_DEFINITION
#include "backend/direct_out.h"

#include <ATen/core/List.h>
#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>
#include <ATen/core/stack.h>
#include <ATen/native/layer_norm.h>
#include <torch/library.h>

#include "trace/counters.h"


namespace neuron::backend {

namespace {

// Each kernel reads the functional op's arguments and then its outputs from the stack
// (OpWork::build_stack with outputs, or a tile's views of them), writes the outputs and
// leaves them as the results. Where the direct path's conditions do not hold (inputs or
// outputs that are not contiguous, empty tensors) it runs the functional kernel and
// copies, as ATen's generated out variant does.

trace::Counter g_direct{"direct_out_runs"};         // straight into our outputs
trace::Counter g_copied{"direct_out_copies"};       // conditions unmet: functional kernel, then a copy

at::Tensor optional_tensor(const c10::IValue& v) { return v.isTensor() ? v.toTensor() : at::Tensor(); }

bool contiguous_or_absent(const at::Tensor& t) { return !t.defined() || t.is_contiguous(); }

// A normalized shape, without a heap allocation.
c10::SmallVector<int64_t, 8> int_list(const c10::IValue& v) {
  c10::SmallVector<int64_t, 8> out;
  for (const c10::IValue& e : v.toListRef()) out.push_back(e.isInt() ? e.toInt() : e.toSymInt().guard_int(__FILE__, __LINE__));
  return out;
}

// The functional op run on the same arguments, its results copied into the outputs.
void functional_then_copy(const c10::OperatorHandle& op, torch::jit::Stack* stack, size_t num_outs) {
  ++g_copied;
  std::vector<at::Tensor> outs;
  for (size_t k = 0; k < num_outs; ++k) outs.push_back(optional_tensor((*stack)[stack->size() - num_outs + k]));
  torch::jit::drop(*stack, num_outs);
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  auto results = torch::jit::pop(*stack, num_outs);
  for (size_t k = 0; k < num_outs; ++k)
    if (outs[k].defined() && results[k].isTensor()) outs[k].copy_(results[k].toTensor());
  for (auto& t : outs) stack->emplace_back(std::move(t));
}

// native_layer_norm(input, normalized_shape, weight?, bias?, eps) -> (out, mean, rstd):
// layer_norm_cpu's kernel call, into our outputs.
void layer_norm(const c10::OperatorHandle&, c10::DispatchKeySet, torch::jit::Stack* stack) {
  auto args = torch::jit::last(*stack, 8);
  const at::Tensor input = args[0].toTensor();
  const auto shape = int_list(args[1]);
  const at::Tensor weight = optional_tensor(args[2]), bias = optional_tensor(args[3]);
  const double eps = args[4].toDouble();
  at::Tensor out = args[5].toTensor(), mean = args[6].toTensor(), rstd = args[7].toTensor();
  if (input.numel() == 0 || !input.is_contiguous() || !contiguous_or_absent(weight) ||
      !contiguous_or_absent(bias) || !out.is_contiguous() || !mean.is_contiguous() || !rstd.is_contiguous()) {
    static const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::native_layer_norm", "");
    return functional_then_copy(op, stack, 3);
  }
  const auto [m, n] = at::native::_check_layer_norm_inputs(input, shape, weight, bias);
  ++g_direct;
  at::native::LayerNormKernel(at::kCPU, input, weight, bias, m, n, eps, &out, &mean, &rstd);
  torch::jit::drop(*stack, 8);
  stack->emplace_back(std::move(out));
  stack->emplace_back(std::move(mean));
  stack->emplace_back(std::move(rstd));
}

// native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight?,
// bias?, output_mask) -> (grad_input, grad_weight, grad_bias): layer_norm_backward_cpu's
// kernel call. Its outputs need no zeroing: with rows to reduce the kernel writes them all.
void layer_norm_backward(const c10::OperatorHandle&, c10::DispatchKeySet, torch::jit::Stack* stack) {
  auto args = torch::jit::last(*stack, 11);
  const at::Tensor dy = args[0].toTensor(), input = args[1].toTensor();
  const auto shape = int_list(args[2]);
  const at::Tensor mean = args[3].toTensor(), rstd = args[4].toTensor();
  const at::Tensor weight = optional_tensor(args[5]), bias = optional_tensor(args[6]);
  const c10::List<bool> mask = args[7].toBoolList();
  at::Tensor outs[3] = {optional_tensor(args[8]), optional_tensor(args[9]), optional_tensor(args[10])};
  bool direct = input.numel() > 0 && input.is_contiguous() && dy.is_contiguous() &&
                contiguous_or_absent(weight) && contiguous_or_absent(bias) && mask.size() == 3;
  for (int k = 0; direct && k < 3; ++k) direct = !mask.get(k) || (outs[k].defined() && outs[k].is_contiguous());
  if (!direct) {
    static const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::native_layer_norm_backward", "");
    return functional_then_copy(op, stack, 3);
  }
  const auto [m, n] = at::native::_check_layer_norm_inputs(input, shape, weight, bias);
  at::Tensor dx = mask.get(0) ? outs[0] : at::Tensor();
  at::Tensor dgamma = mask.get(1) ? outs[1] : at::Tensor();
  at::Tensor dbeta = mask.get(2) ? outs[2] : at::Tensor();
  ++g_direct;
  at::native::LayerNormBackwardKernel(at::kCPU, dy, input, mean, rstd, weight, m, n, &dx, &dgamma, &dbeta);
  torch::jit::drop(*stack, 11);
  for (auto& t : outs) stack->emplace_back(std::move(t));
}

}  // namespace

TORCH_LIBRARY(neuron_direct, m) {
  m.def("native_layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight, Tensor? bias, float eps, "
        "*, Tensor(a!) out0, Tensor(b!) out1, Tensor(c!) out2) -> (Tensor(a!), Tensor(b!), Tensor(c!))");
  m.def("native_layer_norm_backward(Tensor grad_out, Tensor input, SymInt[] normalized_shape, Tensor mean, "
        "Tensor rstd, Tensor? weight, Tensor? bias, bool[3] output_mask, *, Tensor(a!) out0, Tensor(b!) out1, "
        "Tensor(c!) out2) -> (Tensor(a!), Tensor(b!), Tensor(c!))");
}

TORCH_LIBRARY_IMPL(neuron_direct, CPU, m) {
  m.impl("native_layer_norm", torch::CppFunction::makeFromBoxedFunction<&layer_norm>());
  m.impl("native_layer_norm_backward", torch::CppFunction::makeFromBoxedFunction<&layer_norm_backward>());
}

std::optional<c10::OperatorHandle> direct_out_variant(const std::string& name, const std::string& overload) {
  static const char* const kOps[] = {"aten::native_layer_norm", "aten::native_layer_norm_backward"};
  if (!overload.empty()) return std::nullopt;
  for (const char* op : kOps) {
    if (name != op) continue;
    return c10::Dispatcher::singleton().findSchema({"neuron_direct::" + name.substr(6), ""});
  }
  return std::nullopt;
}

}  // namespace neuron::backend
