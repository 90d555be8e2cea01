// Tier 2 for tile groups: the kernel spec and its binding from the group's ops. Pointwise
// groups: ops with a formula over full-size operands (and scalars). Row groups (tiles of
// whole rows) also: softmax, log_softmax and layer norm over the last dim, and operands
// that are one row broadcast down the rows (a weight) or one value per row.
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
  const OpWork& first = *ops[step.first];
  if (first.output_metas.empty()) return why_not = "no output", false;
  const auto dtype = static_cast<c10::ScalarType>(first.output_metas[0].dtype);
  if (!element_type(dtype, spec.type, why_not)) return false;
  spec.fast = policy_.numerics == fusion::Numerics::kFast;
  const int64_t R = step.row, rows = R > 0 ? step.numel / R : 0;
  spec.row = R;
  spec.rows = rows;

  struct Produced {
    int32_t op;
    int32_t output;
  };
  std::unordered_map<uint64_t, Produced> produced;  // storage -> output of an op of the group
  std::unordered_map<uint64_t, int32_t> external;   // storage -> pointer index
  NativeBinding binding;
  auto& registry = trace::OpRegistry::instance();
  for (uint32_t k = 0; k < step.count; ++k) {
    const OpWork& op = *ops[step.first + k];
    fusion::KernelOp kop;
    kop.name = registry.name(op.record.op);
    const bool row_op = R > 0 && fusion::native_row_op_supported(kop.name);
    if (!row_op && !fusion::native_op_supported(kop.name, spec.type, spec.fast))
      return why_not = kop.name + " has no native formula for this element type", false;
    for (const auto& m : op.output_metas)
      if (static_cast<c10::ScalarType>(m.dtype) != dtype) return why_not = kop.name + ": output type differs from the group's", false;
    // Results are whole rows, or one value per row (row sums, ops on them: row groups).
    const int64_t out_numel = op.output_metas[0].numel();
    if (out_numel != step.numel && !(R > 0 && out_numel == rows))
      return why_not = kop.name + ": output of " + std::to_string(out_numel) + " elements", false;
    kop.per_row = !row_op && out_numel != step.numel;
    if (kop.name == "aten::pow.Tensor_Scalar" && !(op.values.size() > 1 && op.values[1].isScalar() &&
                                                  op.values[1].toScalar().toDouble() == 2.0))
      return why_not = "aten::pow.Tensor_Scalar with an exponent other than 2 has no native formula", false;
    if (!row_op && op.output_metas.size() != 1) return why_not = kop.name + ": several outputs", false;
    for (size_t a = 0; a < op.slots.size(); ++a) {
      const ArgSlot& slot = op.slots[a];
      fusion::KernelArg arg;
      if (slot.kind == SlotKind::kValue) {
        const c10::IValue& v = op.values[a];
        const bool number = v.isDouble() || v.isInt() || (v.isScalar() && !v.isBool() && !v.isComplexDouble());
        if (row_op && kop.name != "aten::native_layer_norm") {
          // Softmax's (dim, half_to_float), a row sum's (dims, keepdim, dtype): the engine
          // checked the dim is the last; the generator checks the flags.
          arg.kind = fusion::KernelArg::kConst;
          arg.text = v.isBool() ? (v.toBool() ? "true" : "false") : v.isNone() ? "None" : "dim";
        } else if (number && !(row_op && a == 1)) {
          arg.kind = fusion::KernelArg::kScalar;
          arg.index = static_cast<int32_t>(binding.scalars.size());
          binding.scalars.push_back({k, false, static_cast<uint32_t>(a)});
        } else if (v.isString() || v.isNone() || v.isIntList()) {
          arg.kind = fusion::KernelArg::kConst;
          arg.text = v.isString() ? v.toStringRef() : v.isNone() ? "None" : "shape";
        } else {
          return why_not = kop.name + ": argument " + std::to_string(a) + " is not a number", false;
        }
      } else if (slot.kind == SlotKind::kTensor) {
        const trace::TensorMeta& m = op.record.tensors[slot.first];
        const TensorSource& src = op.inputs[slot.first];
        if (!m.defined) {
          arg.kind = fusion::KernelArg::kConst;
          arg.text = "None";
        } else if (!src.storage) {
          if (!src.host.defined() || src.host.dim() != 0) return why_not = kop.name + ": host tensor argument", false;
          arg.kind = fusion::KernelArg::kScalar;
          arg.index = static_cast<int32_t>(binding.scalars.size());
          binding.scalars.push_back({k, true, slot.first});
        } else if (static_cast<c10::ScalarType>(m.dtype) != dtype) {
          return why_not = kop.name + ": operand type differs from the group's", false;
        } else if (m.ndim == 0) {
          arg.kind = fusion::KernelArg::kScalarInput;
          arg.index = static_cast<int32_t>(binding.pointers.size());
          binding.pointers.push_back({k, false, slot.first});
        } else if (auto p = produced.find(m.storage); p != produced.end()) {
          arg.kind = fusion::KernelArg::kValue;
          arg.index = p->second.op;
          arg.output = p->second.output;
        } else {
          const int64_t n = m.numel(), last = m.sizes[m.ndim - 1];
          if (n == step.numel) arg.kind = fusion::KernelArg::kInput;
          else if (R == 0) return why_not = kop.name + ": operand broadcast along rows", false;
          else if (n == R && last == R) arg.kind = fusion::KernelArg::kColumnInput;
          else if (n == rows && last == 1) arg.kind = fusion::KernelArg::kRowInput;
          else return why_not = kop.name + ": operand of " + std::to_string(n) + " elements in rows of " + std::to_string(R), false;
          if (auto e = external.find(m.storage); e != external.end()) {
            arg.index = e->second;
          } else {
            arg.index = static_cast<int32_t>(binding.pointers.size());
            external[m.storage] = arg.index;
            binding.pointers.push_back({k, false, slot.first});
          }
        }
      } else {
        return why_not = kop.name + ": tensor-list argument", false;
      }
      kop.args.push_back(std::move(arg));
    }
    for (size_t o = 0; o < op.output_metas.size(); ++o) {
      const bool kept = !step.scratch[k][o];
      const int32_t at = kept ? static_cast<int32_t>(binding.pointers.size()) : -1;
      if (kept) binding.pointers.push_back({k, true, static_cast<uint32_t>(o)});
      if (o == 0) kop.store = at;
      else kop.row_stores.push_back(at);
      produced[op.output_storages[o].id] = {static_cast<int32_t>(k), static_cast<int32_t>(o)};
    }
    spec.ops.push_back(std::move(kop));
  }
  return keep_binding(std::move(binding), spec);
}

}  // namespace neuron::backend
