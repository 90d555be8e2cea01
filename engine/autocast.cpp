// Autocast for device_type="neuron": the op lists and policies CUDA uses.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace {

using namespace at::autocast;

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
#define NEURON_LOWER(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define NEURON_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define NEURON_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_LOWER_PRECISION_FP(NEURON_LOWER)
  AT_FORALL_FP32(NEURON_FP32)
  AT_FORALL_PROMOTE(NEURON_PROMOTE)
#undef NEURON_LOWER
#undef NEURON_FP32
#undef NEURON_PROMOTE
}

}  // namespace
