// Output strides of convolutions as CPU eager lays them out. A CPU convolution writes its
// outputs in the memory format of the kernel it picks (oneDNN and the slow 2-d kernels
// take channels-last when the input or the weight is channels-last); the Meta kernel that
// sizes queued outputs always answers contiguous. The strides matter beyond looks: the ops
// after a convolution (GroupNorm, for one) reduce in another order per layout, so values
// drift from CPU's when the layout does.
#include "engine/conv_layout.h"

#include <ATen/native/ConvUtils.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/MemoryFormat.h>

namespace neuron::engine {
namespace {

// A CPU tensor with t's geometry over a dummy pointer: CPU's kernel choice reads only
// sizes, strides and dtypes, never the data.
at::Tensor geometry_only(const at::Tensor& t) {
  alignas(64) static char dummy[64];
  return at::from_blob(dummy, t.sizes(), t.strides(),
                       at::TensorOptions().dtype(t.scalar_type()).device(at::kCPU));
}

// Rewrites m's strides for the memory format (m keeps its sizes).
void restride(trace::TensorMeta& m, at::MemoryFormat format) {
  if (format != at::MemoryFormat::ChannelsLast && format != at::MemoryFormat::ChannelsLast3d)
    return;
  const size_t nd = m.ndim;
  if ((format == at::MemoryFormat::ChannelsLast && nd != 4) ||
      (format == at::MemoryFormat::ChannelsLast3d && nd != 5))
    return;
  c10::IntArrayRef sizes(m.sizes.data(), nd);
  const std::vector<int64_t> strides = nd == 4 ? c10::get_channels_last_strides_2d(sizes)
                                               : c10::get_channels_last_strides_3d(sizes);
  for (size_t d = 0; d < nd; ++d) m.strides[d] = strides[d];
}

std::optional<at::MemoryFormat> cpu_conv_format(const at::Tensor& input, const at::Tensor& weight,
                                                const c10::IValue& bias,
                                                const c10::IValue& bias_sizes,
                                                c10::ArrayRef<c10::IValue> params) {
  // params: stride, padding, dilation, transposed, output_padding, groups
  if (input.dim() < 4 || input.dim() != weight.dim() || input.is_complex()) return std::nullopt;
  std::optional<at::Tensor> cpu_bias;
  if (bias.isTensor() && bias.toTensor().defined()) cpu_bias = geometry_only(bias.toTensor());
  std::optional<std::vector<c10::SymInt>> sizes_of_bias;
  if (bias_sizes.isIntList()) {
    sizes_of_bias.emplace();
    for (int64_t s : bias_sizes.toIntVector()) sizes_of_bias->emplace_back(s);
  }
  const auto stride = params[0].toIntVector(), padding = params[1].toIntVector(),
             dilation = params[2].toIntVector(), output_padding = params[4].toIntVector();
  const at::Tensor in = geometry_only(input), w = geometry_only(weight);
  at::OptionalSymIntArrayRef bias_ref;
  if (sizes_of_bias) bias_ref = c10::SymIntArrayRef(*sizes_of_bias);
  const auto backend = at::native::select_conv_backend(
      in, w, cpu_bias, c10::fromIntArrayRefSlow(stride), c10::fromIntArrayRefSlow(padding),
      c10::fromIntArrayRefSlow(dilation), params[3].toBool(),
      c10::fromIntArrayRefSlow(output_padding), c10::SymInt(params[5].toInt()), bias_ref);
  return at::native::_determine_backend_memory_format(in, w, backend);
}

}  // namespace

void match_cpu_conv_layout(const std::string& op_name, c10::ArrayRef<c10::IValue> args,
                           std::vector<trace::TensorMeta>& outs, size_t first_return) {
  if (op_name == "aten::convolution") {
    // input, weight, bias, stride, padding, dilation, transposed, output_padding, groups
    if (args.size() < 9 || !args[0].isTensor() || !args[1].isTensor() ||
        outs.size() < first_return + 1)
      return;
    const auto format = cpu_conv_format(args[0].toTensor(), args[1].toTensor(), args[2],
                                        c10::IValue(), args.slice(3, 6));
    if (format) restride(outs[first_return], *format);
  } else if (op_name == "aten::convolution_backward") {
    // grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
    // output_padding, groups, output_mask -> grad_input, grad_weight, grad_bias
    if (args.size() < 11 || !args[1].isTensor() || !args[2].isTensor() ||
        outs.size() < first_return + 2)
      return;
    const auto format = cpu_conv_format(args[1].toTensor(), args[2].toTensor(), c10::IValue(),
                                        args[3], args.slice(4, 6));
    if (!format) return;
    restride(outs[first_return], *format);
    restride(outs[first_return + 1], *format);
  }
}

}  // namespace neuron::engine
