// Tier 2 for pointwise (tile) groups: the kernel spec and its binding from the group's
// ops, runs of the kernel over tiles, and its side-by-side trial against tier 1.
#include <ATen/ops/empty.h>

#include <algorithm>
#include <unordered_map>

#include "backend/native_group.h"
#include "backend/native_group_detail.h"
#include "trace/op_registry.h"

namespace neuron::backend {
using namespace detail;

bool NativeGroup::build_spec(const std::vector<std::unique_ptr<OpWork>>& ops,
                             const fusion::Step& step, fusion::KernelSpec& spec,
                             std::string& why_not) {
  if (step.kind == fusion::Step::kForeachGroup) return build_foreach_spec(ops, step, spec, why_not);
  if (step.row > 0) return build_row_spec(ops, step, spec, why_not);
  const OpWork& first = *ops[step.first];
  if (first.output_metas.empty()) return why_not = "no output", false;
  const auto dtype = static_cast<c10::ScalarType>(first.output_metas[0].dtype);
  if (!element_type(dtype, spec.type, why_not)) return false;

  std::unordered_map<uint64_t, int32_t> produced;  // storage -> op of the group
  std::unordered_map<uint64_t, int32_t> external;  // storage -> pointer index
  NativeBinding binding;
  auto& registry = trace::OpRegistry::instance();
  for (uint32_t k = 0; k < step.count; ++k) {
    const OpWork& op = *ops[step.first + k];
    fusion::KernelOp kop;
    kop.name = registry.name(op.record.op);
    if (!fusion::native_op_supported(kop.name, spec.type))
      return why_not = kop.name + " has no native formula for this element type", false;
    if (op.output_metas.size() != 1 || static_cast<c10::ScalarType>(op.output_metas[0].dtype) != dtype)
      return why_not = kop.name + ": output type differs from the group's", false;
    for (size_t a = 0; a < op.slots.size(); ++a) {
      const ArgSlot& slot = op.slots[a];
      fusion::KernelArg arg;
      if (slot.kind == SlotKind::kValue) {
        const c10::IValue& v = op.values[a];
        if (v.isDouble() || v.isInt() || (v.isScalar() && !v.isBool() && !v.isComplexDouble())) {
          arg.kind = fusion::KernelArg::kScalar;
          arg.index = static_cast<int32_t>(binding.scalars.size());
          binding.scalars.push_back({k, false, static_cast<uint32_t>(a)});
        } else if (v.isString()) {
          arg.kind = fusion::KernelArg::kConst;
          arg.text = v.toStringRef();
        } else if (v.isNone()) {
          arg.kind = fusion::KernelArg::kConst;
          arg.text = "None";
        } else {
          return why_not = kop.name + ": argument " + std::to_string(a) + " is not a number", false;
        }
      } else if (slot.kind == SlotKind::kTensor) {
        const trace::TensorMeta& m = op.record.tensors[slot.first];
        const TensorSource& src = op.inputs[slot.first];
        if (!m.defined) return why_not = kop.name + ": undefined tensor argument", false;
        if (!src.storage) {
          if (!src.host.defined() || src.host.dim() != 0)
            return why_not = kop.name + ": host tensor argument", false;
          arg.kind = fusion::KernelArg::kScalar;
          arg.index = static_cast<int32_t>(binding.scalars.size());
          binding.scalars.push_back({k, true, slot.first});
        } else if (m.ndim > 0 && m.numel() != step.numel) {
          return why_not = kop.name + ": operand broadcast along rows", false;
        } else if (static_cast<c10::ScalarType>(m.dtype) != dtype) {
          return why_not = kop.name + ": operand type differs from the group's", false;
        } else if (m.ndim == 0) {
          arg.kind = fusion::KernelArg::kScalarInput;
          arg.index = static_cast<int32_t>(binding.pointers.size());
          binding.pointers.push_back({k, false, slot.first});
        } else if (auto p = produced.find(m.storage); p != produced.end()) {
          arg.kind = fusion::KernelArg::kValue;
          arg.index = p->second;
        } else if (auto e = external.find(m.storage); e != external.end()) {
          arg.kind = fusion::KernelArg::kInput;
          arg.index = e->second;
        } else {
          arg.kind = fusion::KernelArg::kInput;
          arg.index = static_cast<int32_t>(binding.pointers.size());
          external[m.storage] = arg.index;
          binding.pointers.push_back({k, false, slot.first});
        }
      } else {
        return why_not = kop.name + ": tensor-list argument", false;
      }
      kop.args.push_back(std::move(arg));
    }
    if (!step.scratch[k][0]) {
      kop.store = static_cast<int32_t>(binding.pointers.size());
      binding.pointers.push_back({k, true, 0});
    }
    produced[op.output_storages[0].id] =
        static_cast<int32_t>(k);
    spec.ops.push_back(std::move(kop));
  }
  return keep_binding(std::move(binding), spec);
}

void NativeGroup::run_kernel(const std::vector<std::unique_ptr<OpWork>>& ops,
                             const fusion::Step& step, const std::vector<char*>* output_override) {
  fusion::NativeKernelFn fn = fn_.load();
  std::vector<char*> ptrs(binding_.pointers.size());
  size_t next_output = 0;
  for (size_t i = 0; i < ptrs.size(); ++i) {
    const auto& b = binding_.pointers[i];
    const OpWork& op = *ops[step.first + b.op];
    if (b.output)
      ptrs[i] = output_override ? (*output_override)[next_output++]
                                : data_of(op.output_storages[b.index], op.output_metas[b.index]);
    else
      ptrs[i] = data_of(op.inputs[b.index].storage, op.record.tensors[b.index]);
  }
  std::vector<double> scalars(binding_.scalars.size());
  for (size_t i = 0; i < scalars.size(); ++i) {
    const auto& b = binding_.scalars[i];
    const OpWork& op = *ops[step.first + b.op];
    scalars[i] = b.from_tensor ? op.inputs[b.index].host.item<double>() : scalar_value(op.values[b.index]);
  }
  const int64_t numel = step.numel;
  // Tiles only spread the work over threads; a multiple of 64 elements, so the scalar
  // tail falls where tier 1 (and ATen) put it: at the end of the tensor.
  // Row kernels run whole rows.
  const int64_t tile = step.row > 0 ? std::max<int64_t>(1, policy_.native_tile(numel) / step.row) * step.row
                                    : policy_.native_tile(numel);
  const int64_t tiles = (numel + tile - 1) / tile;
  // Tiles never depend on the thread count. Small groups stay on this thread (waking a
  // helper costs more than they take); larger ones spread once the host waits.
  if (numel * static_cast<int64_t>(ptrs.size()) < static_cast<int64_t>(policy_.spread_elements)) {
    set_item_threads_to(1);
    for (int64_t t = 0; t < tiles; ++t) fn(t * tile, std::min(numel, (t + 1) * tile), ptrs.data(), scalars.data());
    return;
  }
  run_free_units(tiles, [&](int64_t t) { fn(t * tile, std::min(numel, (t + 1) * tile), ptrs.data(), scalars.data()); });
}

void NativeGroup::trial(const std::vector<std::unique_ptr<OpWork>>& ops, const fusion::Step& step,
                        uint64_t tier1_ns) {
  // Tier 1 already wrote the results; tier 2 writes into scratch copies, then both are
  // compared element by element (NaN equals NaN; every other value bit for bit).
  const size_t elem = type_ == fusion::ElemType::kFloat32 ? 4 : 8;
  std::vector<at::Tensor> scratch;
  std::vector<char*> outs;
  for (const auto& b : binding_.pointers)
    if (b.output) {
      const int64_t numel = ops[step.first + b.op]->output_metas[b.index].numel();  // a row op's stats: one per row
      scratch.push_back(at::empty({numel}, at::TensorOptions().dtype(
                                               type_ == fusion::ElemType::kFloat32 ? c10::kFloat : c10::kDouble)));
      outs.push_back(static_cast<char*>(scratch.back().data_ptr()));
    }
  const uint64_t start = steady_ns();
  run_kernel(ops, step, &outs);
  const uint64_t tier2_ns = steady_ns() - start;
  bool equal = true;
  size_t o = 0;
  for (const auto& b : binding_.pointers) {
    if (!b.output) continue;
    const OpWork& op = *ops[step.first + b.op];
    const char* want = data_of(op.output_storages[b.index], op.output_metas[b.index]);
    const char* got = outs[o++];
    const int64_t numel = op.output_metas[b.index].numel();
    for (int64_t i = 0; i < numel && equal; ++i)
      equal = same_value(want + i * elem, got + i * elem, type_);
  }
  judge(equal, tier1_ns, tier2_ns);
}

}  // namespace neuron::backend
