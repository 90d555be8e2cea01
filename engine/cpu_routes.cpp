// Routes that make neuron run the kernels CPU eager runs, so results match bit for bit:
// ops whose CPU kernel would otherwise lose to a generic composite on PrivateUse1,
// convolution (which PyTorch sends to *_overrideable on other backends) and the choice of
// fused attention kernel.
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_fused_sdp_choice.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <unordered_set>

#include "backend/op_work.h"
#include "engine/dispatch.h"
#include "engine/engine.h"
#include "engine/pch.h"
#include "trace/log.h"

namespace neuron::engine {
namespace {

const c10::OperatorHandle& handle(const char* name, const char* overload) {
  static std::unordered_map<std::string, c10::OperatorHandle>* cache =
      new std::unordered_map<std::string, c10::OperatorHandle>();
  std::string key = std::string(name) + "." + overload;
  auto it = cache->find(key);
  if (it == cache->end())
    it = cache->emplace(key, c10::Dispatcher::singleton().findSchemaOrThrow(name, overload)).first;
  return it->second;
}

// convolution_overrideable has exactly aten::convolution's arguments.
void convolution_boxed(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  static const c10::OperatorHandle conv = handle("aten::convolution", "");
  neuron_fallback(conv, stack);
}

// convolution_backward_overrideable lacks bias_sizes; aten::convolution_backward wants it
// after weight (argument 3).
void convolution_backward_boxed(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  static const c10::OperatorHandle backward = handle("aten::convolution_backward", "");
  // overrideable: grad_output, input, weight, stride, padding, dilation, transposed,
  // output_padding, groups, output_mask
  const size_t n = 10;
  auto args = torch::jit::last(*stack, n);
  const at::Tensor& weight = args[2].toTensor();
  const bool transposed = args[6].toBool();
  const int64_t groups = args[8].toInt();
  const auto mask = args[9].toBoolList();
  c10::IValue bias_sizes;
  if (mask.get(2)) {
    const int64_t channels = transposed ? weight.size(1) * groups : weight.size(0);
    bias_sizes = c10::IValue(std::vector<int64_t>{channels});
  }
  stack->insert(stack->end() - static_cast<std::ptrdiff_t>(n - 3), std::move(bias_sizes));
  neuron_fallback(backward, stack);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("convolution_overrideable",
         torch::CppFunction::makeFromBoxedFunction<&convolution_boxed>());
  m.impl("convolution_backward_overrideable",
         torch::CppFunction::makeFromBoxedFunction<&convolution_backward_boxed>());
}

// The attention kernel choice reads only shapes, dtypes and flags: ask the CPU rule on
// aliases, without waiting for the queue.
at::Tensor shallow_alias(const at::Tensor& t) {
  trace::TensorMeta m;
  TORCH_CHECK(backend::describe_tensor(t, m), "neuron: too many dimensions");
  return backend::cpu_alias(t.storage(), m);
}

int64_t sdp_choice(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                   const std::optional<at::Tensor>& mask, double dropout_p, bool is_causal,
                   std::optional<double> scale, bool enable_gqa) {
  std::optional<at::Tensor> cpu_mask;
  if (mask && mask->defined()) cpu_mask = shallow_alias(*mask);
  // CPU's rule reads only shapes, strides and dtypes. Under FakeTensorMode (torch.compile
  // tracing) the aliases must not reach the Python mode, which rejects real tensors.
  c10::impl::ExcludeDispatchKeyGuard no_python(
      c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
  return at::_fused_sdp_choice(shallow_alias(q), shallow_alias(k), shallow_alias(v), cpu_mask,
                               dropout_p, is_causal, scale, enable_gqa);
}

}  // namespace
}  // namespace neuron::engine

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &neuron::engine::sdp_choice)
}

namespace neuron::engine {

// Ops with a CPU kernel of their own and a composite kernel would run the composite on
// neuron (rounding differently); send them through the fallback, which runs the CPU one.
void register_cpu_kernel_routes() {
  static auto* library = new torch::Library(torch::Library::IMPL, "aten",
                                            c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  size_t routed = 0;
  for (const auto& name : c10::Dispatcher::singleton().getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) continue;
    auto h = c10::Dispatcher::singleton().findOp(name);
    if (!h) continue;
    // Foreach ops have one composite kernel for CPU (a loop of per-tensor ops): on neuron
    // they are one queued op for the whole list, not one per tensor.
    const bool foreach = name.name.rfind("aten::_foreach_", 0) == 0;
    if (!foreach && !h->hasKernelForDispatchKey(c10::DispatchKey::CPU)) continue;
    if (h->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) continue;
    if (!h->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) &&
        !h->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional))
      continue;
    std::string full = name.name.substr(6) + (name.overload_name.empty() ? "" : "." + name.overload_name);
    library->impl(full.c_str(), torch::CppFunction::makeFromBoxedFunction<&neuron_fallback>());
    ++routed;
  }
  trace::log(trace::LogLevel::kDebug,
             "routed " + std::to_string(routed) + " ops with CPU kernels through the fallback");
}

}  // namespace neuron::engine
