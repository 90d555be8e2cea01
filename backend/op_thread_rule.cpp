// An op's thread rule applied to its tensors: whether its bits are the same at any
// intra-op thread count, and so how many threads the worker gives it.
#include "backend/op_thread_rule.h"

#include "backend/op_work.h"

namespace neuron::backend {

int64_t OpWork::work_elements() const {
  int64_t elements = 0;
  for (const auto& m : record.tensors) elements += m.numel();
  for (const auto& m : output_metas) elements += m.numel();
  return elements;
}

int64_t OpWork::matmul_work() const {
  // Multiply-adds over 32, in elementwise-op equivalents for spread_elements(): output
  // elements times the inner dim, the next-to-last dim of the last tensor argument (mat2
  // of mm, addmm, bmm, baddbmm; vec of mv, addmv).
  if (record.tensors.empty() || output_metas.empty()) return work_elements();
  const trace::TensorMeta& last = record.tensors.back();
  const int64_t inner = last.ndim >= 2 ? last.sizes[last.ndim - 2] : last.ndim == 1 ? last.sizes[0] : 1;
  return output_metas[0].numel() * inner / 32;
}

bool OpWork::thread_free() const {
  switch (threads) {
    case ThreadRule::kFixed:
      return false;
    case ThreadRule::kFree:
      return true;
    case ThreadRule::kElementwise:
      break;
    case ThreadRule::kMatmul:
    case ThreadRule::kReduction:
      return trial_thread_free(*this);
    case ThreadRule::kRowLastDim: {
      // The dim is the first int argument (after the tensors: _softmax's self,
      // _log_softmax_backward_data's grad_output and output).
      if (record.tensors.empty()) return false;
      for (const c10::IValue& v : values)
        if (v.isInt()) {
          const int64_t dim = v.toInt(), ndim = record.tensors[0].ndim;
          return dim == -1 || dim == ndim - 1;
        }
      return false;
    }
  }
  // Foreach ops run one elementwise kernel per tensor: each tensor on its own. Other ops:
  // one kernel over the output's elements, every operand of that size or 0-dim (any
  // broadcast or strided operand makes 2-D loops whose rows a split may cut).
  const bool per_tensor = !slots.empty() && slots[0].kind == SlotKind::kTensorList;
  int64_t numel = -1;
  auto fits = [&](const trace::TensorMeta& m) {
    if (!m.defined || m.ndim == 0) return true;
    if (!contiguous(m)) return false;
    if (per_tensor) return elementwise_split_free(m.numel());
    if (numel < 0) numel = m.numel();
    return m.numel() == numel;
  };
  for (const auto& m : record.tensors)
    if (!fits(m)) return false;
  for (const auto& m : output_metas)
    if (!fits(m)) return false;
  return per_tensor || numel < 0 || elementwise_split_free(numel);
}

void OpWork::set_threads() const {
  if (threads == ThreadRule::kMatmul) {
    // Large products take CPU eager's count even while the host is busy (the host soon
    // waits for them; one thread would leave a core idle for the rest of the product).
    const int64_t work = matmul_work();
    set_item_threads(work < large_matmul_work() && thread_free(), work);
  } else {
    set_item_threads(thread_free(), work_elements());
  }
}

}  // namespace neuron::backend
