#include "engine/shape_inference.h"

#include <ATen/ops/empty_like.h>

#include "engine/conv_layout.h"
#include "engine/counters.h"
#include "engine/fast_meta.h"
#include "trace/log.h"

namespace neuron::engine {

using backend::OpWork;
using trace::TensorMeta;

void infer_with_meta(const c10::OperatorHandle& op, const OpInfo& info, const OpWork& work,
                     c10::ArrayRef<c10::IValue> args, std::vector<TensorMeta>& outs) {
  bump(g_counters.meta_runs);
  torch::jit::Stack stack;
  stack.reserve(args.size());
  auto meta_of = [&](uint32_t k) -> at::Tensor {
    const TensorMeta& m = work.record.tensors[k];
    if (!m.defined) return at::Tensor();
    const auto& host = work.inputs[k].host;
    if (host.defined() && host.dim() == 0) return host;  // CPU scalars mix with any device
    return backend::meta_tensor(m);
  };
  work.push_arguments(stack, meta_of, [&](size_t i) -> c10::IValue {
    const c10::IValue& v = args[i];
    if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1)
      return c10::IValue(c10::Device(c10::kMeta));
    if (v.isGenerator()) return c10::IValue();
    return v;
  });
  // Written arguments keep their identity through the call: remember them.
  std::vector<c10::IValue> written;
  for (int w : info.write_args) written.push_back(stack[static_cast<size_t>(w)]);
  if (info.fast_meta != nullptr && run_fast_meta(*info.fast_meta, op, stack))
    bump(g_counters.fast_meta_runs);
  else {
    if (trace::log_enabled(trace::LogLevel::kDebug))
      trace::log(trace::LogLevel::kDebug, "shape inference by the dispatcher's Meta kernel: " + info.name);
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &stack);
  }
  outs.clear();
  auto push = [&](const at::Tensor& t) {
    TensorMeta m;
    TORCH_CHECK(backend::describe_tensor(t, m), "neuron: too many dimensions");
    outs.push_back(m);
  };
  for (const c10::IValue& w : written) {
    if (w.isTensor()) {
      push(w.toTensor());
    } else if (w.isTensorList()) {
      for (const at::Tensor& t : w.toTensorList()) push(t);
    }
  }
  for (size_t r = 0; r < info.returns.size(); ++r) {
    const ReturnInfo& ri = info.returns[r];
    if (ri.kind == ReturnInfo::kInplace) continue;
    const c10::IValue& v = stack[r];
    if (ri.is_list) {
      auto list = v.toTensorList();
      TensorMeta count;
      count.storage_offset = static_cast<int64_t>(list.size());
      outs.push_back(count);
      for (const at::Tensor& t : list) push(t);
    } else {
      push(v.isTensor() ? v.toTensor() : at::Tensor());
    }
  }
}

// Where a Meta kernel's output shapes differ from the CPU kernel's, use the CPU's: batch
// norm outside training returns empty saved statistics on CPU.
void match_cpu_shapes(const OpInfo& info, c10::ArrayRef<c10::IValue> args,
                      std::vector<TensorMeta>& outs, const OpWork& work) {
  // Empty out= tensors resized by the op: CPU's TensorIterator lays them out like their
  // same-shape input (a permuted input gives a permuted output); some Meta kernels resize
  // them contiguous instead. Follow the CPU.
  for (size_t w = 0; w < info.write_args.size() && w < outs.size(); ++w) {
    const size_t arg = static_cast<size_t>(info.write_args[w]);
    if (!info.arg_is_out[arg] || !args[arg].isTensor()) continue;
    const at::Tensor& out = args[arg].toTensor();
    if (out.numel() != 0) continue;
    TensorMeta& m = outs[w];
    for (size_t k = 0; k < work.record.tensors.size(); ++k) {
      const TensorMeta& in = work.record.tensors[k];
      if (!in.defined || in.device < 0 || in.ndim != m.ndim || in.ndim < 2 || in.storage == 0) continue;
      if (k < work.inputs.size() && !work.inputs[k].storage) continue;
      bool same = true;
      for (int d = 0; d < m.ndim; ++d) same &= in.sizes[d] == m.sizes[d];
      if (!same) continue;
      at::Tensor like = at::empty_like(backend::meta_tensor(in), at::MemoryFormat::Preserve);
      for (int d = 0; d < m.ndim; ++d) m.strides[d] = like.stride(d);
      break;
    }
  }
  match_cpu_conv_layout(info.name, args, outs, info.write_args.size());
  const bool batch_norm = info.name == "aten::native_batch_norm" ||
                          info.name == "aten::_native_batch_norm_legit" ||
                          info.name == "aten::_native_batch_norm_legit.no_stats";
  const size_t first_return = info.write_args.size();  // written args come first
  if (!batch_norm || outs.size() != first_return + 3) return;
  const size_t training_arg = info.name == "aten::_native_batch_norm_legit.no_stats" ? 3 : 5;
  if (args.size() <= training_arg || !args[training_arg].isBool() || args[training_arg].toBool())
    return;
  for (size_t i = first_return + 1; i < first_return + 3; ++i) {
    outs[i].ndim = 1;
    outs[i].sizes[0] = 0;
    outs[i].strides[0] = 1;
  }
}

}  // namespace neuron::engine
