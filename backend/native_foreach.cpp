// Tier 2 for foreach groups: the kernel spec from list element 0, the per-element
// binding check, runs over every element (elements that alias otherwise run on tier 1)
// and trials on copies of the state the group updates in place.
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "backend/native_group.h"
#include "backend/native_group_detail.h"
#include "trace/op_registry.h"

namespace neuron::backend {
using namespace detail;
namespace {

// Foreach ops tier 2 has a kernel for: the per-tensor op the CPU's foreach kernel runs on
// each element (its slow path loops over the lists), by in-place name.
const char* foreach_formula(const std::string& name) {
  static const std::unordered_map<std::string, const char*> m = {
      {"aten::_foreach_mul_.Scalar", "aten::mul.Tensor"},
      {"aten::_foreach_mul_.ScalarList", "aten::mul.Tensor"},
      {"aten::_foreach_mul_.List", "aten::mul.Tensor"},
      {"aten::_foreach_div_.Scalar", "aten::div.Tensor"},
      {"aten::_foreach_div_.ScalarList", "aten::div.Tensor"},
      {"aten::_foreach_div_.List", "aten::div.Tensor"},
      {"aten::_foreach_add_.Scalar", "neuron::add_scalar"},
      {"aten::_foreach_add_.ScalarList", "neuron::add_scalar"},
      {"aten::_foreach_add_.List", "aten::add.Tensor"},
      {"aten::_foreach_sub_.Scalar", "neuron::sub_scalar"},
      {"aten::_foreach_sub_.ScalarList", "neuron::sub_scalar"},
      {"aten::_foreach_sub_.List", "aten::sub.Tensor"},
      {"aten::_foreach_lerp_.Scalar", "aten::lerp.Scalar"},
      {"aten::_foreach_addcmul_.Scalar", "aten::addcmul"},
      {"aten::_foreach_addcmul_.ScalarList", "aten::addcmul"},
      {"aten::_foreach_addcdiv_.Scalar", "aten::addcdiv"},
      {"aten::_foreach_addcdiv_.ScalarList", "aten::addcdiv"},
      {"aten::_foreach_maximum_.List", "aten::maximum"},
      {"aten::_foreach_sqrt_", "aten::sqrt"},
      {"aten::_foreach_neg_", "aten::neg"},
      {"aten::_foreach_abs_", "aten::abs"},
      {"aten::_foreach_reciprocal_", "aten::reciprocal"},
  };
  auto it = m.find(name);
  return it == m.end() ? nullptr : it->second;
}

// The in-place name of a functional foreach op (aten::_foreach_sqrt -> aten::_foreach_sqrt_).
std::string inplace_name(const std::string& name) {
  const auto dot = name.find('.');
  std::string base = name.substr(0, dot);
  if (base.back() != '_') base += '_';
  return dot == std::string::npos ? base : base + name.substr(dot);
}

bool is_number(const c10::IValue& v) {
  return v.isDouble() || v.isInt() || (v.isScalar() && !v.isBool() && !v.isComplexDouble());
}

// Element i of a foreach binding: its address and geometry (null address: none on the device).
char* element_address(const OpWork& op, const NativeBinding::Pointer& b, uint32_t i,
                      const trace::TensorMeta*& meta) {
  if (b.output) {
    meta = &op.output_metas[i];
    return data_of(op.output_storages[i], *meta);
  }
  meta = &op.record.tensors[b.index + i];
  const TensorSource& src = op.inputs[b.index + i];
  return src.storage ? data_of(src.storage, *meta) : nullptr;
}

}  // namespace

namespace {

// Element i's addresses (ptrs[p]) and its element count, or -1 when its tensors do not
// alias as the spec's (element 0's) do: every tensor the ops name contiguous, of the
// group's type and of one count, each the array its pointer stands for, and the arrays
// pairwise disjoint.
int64_t bind_element(const std::vector<std::unique_ptr<OpWork>>& ops, const fusion::Step& step,
                     const NativeBinding& binding, c10::ScalarType dtype, uint32_t i, char** ptrs) {
  int64_t n = -1;
  const int64_t elem = static_cast<int64_t>(c10::elementSize(dtype));
  auto geometry_ok = [&](const trace::TensorMeta& m) {
    if (!m.defined || static_cast<c10::ScalarType>(m.dtype) != dtype || !contiguous(m)) return false;
    if (n < 0) n = m.numel();
    return m.numel() == n;
  };
  for (size_t p = 0; p < binding.pointers.size(); ++p) {
    const auto& b = binding.pointers[p];
    const trace::TensorMeta* meta = nullptr;
    ptrs[p] = element_address(*ops[step.first + b.op], b, i, meta);
    if (ptrs[p] == nullptr || !geometry_ok(*meta)) return -1;
  }
  for (const auto& [b, p] : binding.refs) {
    const trace::TensorMeta* meta = nullptr;
    if (element_address(*ops[step.first + b.op], b, i, meta) != ptrs[p] || !geometry_ok(*meta)) return -1;
  }
  const int64_t bytes = std::max<int64_t>(n, 0) * elem;
  for (size_t p = 0; p < binding.pointers.size(); ++p)
    for (size_t q = p + 1; q < binding.pointers.size(); ++q)
      if (bytes > 0 && ptrs[p] < ptrs[q] + bytes && ptrs[q] < ptrs[p] + bytes) return -1;
  return n;
}

}  // namespace

bool NativeGroup::build_foreach_spec(const std::vector<std::unique_ptr<OpWork>>& ops,
                                     const fusion::Step& step, fusion::KernelSpec& spec,
                                     std::string& why_not) {
  const OpWork& first = *ops[step.first];
  if (first.slots.empty() || first.slots[0].kind != SlotKind::kTensorList || first.record.tensors.empty())
    return why_not = "foreach op without a tensor list", false;
  const auto dtype = static_cast<c10::ScalarType>(first.record.tensors[first.slots[0].first].dtype);
  if (!element_type(dtype, spec.type, why_not)) return false;

  // Element 0 sets the structure: one pointer per distinct array, and for every read the
  // array's current value (the op that last wrote it, or the array itself).
  NativeBinding binding;
  std::vector<char*> addrs;
  std::vector<int32_t> last_writer;
  auto& registry = trace::OpRegistry::instance();
  auto pointer_of = [&](const NativeBinding::Pointer& b, uint32_t k, bool& ok) -> uint32_t {
    const trace::TensorMeta* meta = nullptr;
    char* a = element_address(*ops[step.first + k], b, 0, meta);
    ok = a != nullptr && meta->defined && static_cast<c10::ScalarType>(meta->dtype) == dtype && contiguous(*meta);
    if (!ok) return 0;
    for (size_t p = 0; p < addrs.size(); ++p)
      if (addrs[p] == a) {
        binding.refs.push_back({b, static_cast<uint32_t>(p)});
        return static_cast<uint32_t>(p);
      }
    addrs.push_back(a);
    last_writer.push_back(-1);
    binding.pointers.push_back(b);
    binding.refs.push_back({b, static_cast<uint32_t>(addrs.size() - 1)});
    return static_cast<uint32_t>(addrs.size() - 1);
  };
  for (uint32_t k = 0; k < step.count; ++k) {
    const OpWork& op = *ops[step.first + k];
    const std::string name = registry.name(op.record.op);
    const bool functional = op.inplace_op.has_value();
    const char* formula = foreach_formula(functional ? inplace_name(name) : name);
    if (formula == nullptr || !fusion::native_op_supported(formula, spec.type))
      return why_not = name + " has no native formula for this element type", false;
    fusion::KernelOp kop;
    kop.name = formula;
    uint32_t self = 0;
    for (size_t a = 0; a < op.slots.size(); ++a) {
      const ArgSlot& slot = op.slots[a];
      fusion::KernelArg arg;
      if (slot.kind == SlotKind::kTensorList) {
        bool ok = false;
        const uint32_t p = pointer_of({k, false, slot.first}, k, ok);
        if (!ok) return why_not = name + ": a tensor that is not a contiguous " + c10::toString(dtype) + " device tensor", false;
        if (a == 0) self = p;
        if (last_writer[p] >= 0) {
          arg.kind = fusion::KernelArg::kValue;
          arg.index = last_writer[p];
        } else {
          arg.kind = fusion::KernelArg::kInput;
          arg.index = static_cast<int32_t>(p);
        }
      } else if (slot.kind == SlotKind::kValue) {
        const c10::IValue& v = op.values[a];
        if (v.isList() ? v.toListRef().empty() || !is_number(v.toListRef()[0]) : !is_number(v))
          return why_not = name + ": argument " + std::to_string(a) + " is not a number", false;
        arg.kind = fusion::KernelArg::kScalar;
        arg.index = static_cast<int32_t>(binding.scalars.size());
        binding.scalars.push_back({k, false, static_cast<uint32_t>(a)});
      } else {
        return why_not = name + ": argument " + std::to_string(a) + " is not a tensor list or number", false;
      }
      kop.args.push_back(std::move(arg));
    }
    uint32_t target = self;
    if (functional) {
      if (op.output_metas.size() != static_cast<size_t>(step.list)) return why_not = name + ": outputs", false;
      bool ok = false;
      target = pointer_of({k, true, 0}, k, ok);
      if (!ok) return why_not = name + ": its output is not a contiguous device tensor", false;
    }
    last_writer[target] = static_cast<int32_t>(k);
    spec.ops.push_back(std::move(kop));
  }
  // The last value of every written array is stored; earlier ones stay in registers. A
  // fresh output list that dies inside the group (every element scratch) is not stored.
  std::vector<bool> dead(addrs.size(), false);
  for (size_t p = 0; p < addrs.size(); ++p) {
    const auto& b = binding.pointers[p];
    if (!b.output) continue;
    const auto& scratch = step.scratch[b.op];
    dead[p] = scratch.size() == static_cast<size_t>(step.list) &&
              std::all_of(scratch.begin(), scratch.end(), [](bool s) { return s; });
  }
  binding.written.assign(addrs.size(), false);
  for (size_t p = 0; p < addrs.size(); ++p)
    if (last_writer[p] >= 0 && !dead[p]) {
      spec.ops[static_cast<size_t>(last_writer[p])].store = static_cast<int32_t>(p);
      binding.written[p] = true;
    }
  for (size_t p = 0; p < addrs.size(); ++p)
    if (binding.written[p] && spec.ops[static_cast<size_t>(last_writer[p])].store != static_cast<int32_t>(p))
      return why_not = "an op writes two arrays", false;
  std::vector<char*> check(addrs.size());
  if (bind_element(ops, step, binding, dtype, 0, check.data()) < 0)
    return why_not = "the tensors of a list element overlap or differ in size", false;
  return keep_binding(std::move(binding), spec);
}

void NativeGroup::run_foreach_kernel(const std::vector<std::unique_ptr<OpWork>>& ops,
                                     const fusion::Step& step, const ForeachSnapshot* override) {
  const fusion::NativeKernelFn fn = fn_.load();
  const auto dtype = type_ == fusion::ElemType::kFloat32 ? c10::kFloat : c10::kDouble;
  const size_t np = binding_.pointers.size(), ns = binding_.scalars.size();
  const auto list = static_cast<uint32_t>(step.list);
  // Reused per worker thread: no allocation once warm.
  struct Unit {
    uint32_t element;
    int64_t begin, end;
  };
  thread_local std::vector<char*> ptrs;
  thread_local std::vector<double> scalars;
  thread_local std::vector<Unit> units;
  thread_local std::vector<uint32_t> unbound;
  ptrs.resize(list * np);
  scalars.resize(list * ns);
  units.clear();
  unbound.clear();
  // Large tensors are cut into pieces (a multiple of 64 elements, so vector tails fall at
  // each tensor's end) to spread them over threads.
  const auto piece = static_cast<int64_t>(policy_.foreach_piece_elements);
  int64_t elements = 0;
  for (uint32_t i = 0; i < list; ++i) {
    const int64_t n = bind_element(ops, step, binding_, dtype, i, &ptrs[i * np]);
    if (n < 0) {
      unbound.push_back(i);
      continue;
    }
    if (override != nullptr)
      for (size_t p = 0; p < np; ++p)
        if (char* a = override->addresses[i * np + p]) ptrs[i * np + p] = a;
    for (size_t s = 0; s < ns; ++s) {
      const auto& b = binding_.scalars[s];
      const c10::IValue& v = ops[step.first + b.op]->values[b.index];
      scalars[i * ns + s] = scalar_value(v.isList() ? v.toListRef()[i] : v);
    }
    for (int64_t lo = 0; lo < n; lo += piece) units.push_back({i, lo, std::min(n, lo + piece)});
    elements += n;
  }
  char** const P = ptrs.data();
  const double* const S = scalars.data();
  const Unit* const U = units.data();
  auto unit = [&](int64_t u) { fn(U[u].begin, U[u].end, P + U[u].element * np, S + U[u].element * ns); };
  if (elements * static_cast<int64_t>(np) < static_cast<int64_t>(policy_.spread_elements)) {  // not worth waking a helper
    set_item_threads_to(1);
    for (int64_t u = 0; u < static_cast<int64_t>(units.size()); ++u) unit(u);
  } else {
    run_free_units(static_cast<int64_t>(units.size()), unit);
  }
  if (override != nullptr) return;  // a trial: tier 1 ran every element already
  // Elements that alias otherwise run their ops on tier 1 (elements are independent).
  if (unbound.empty()) return;
  count_tier1_elements(unbound.size());
  torch::jit::Stack stack;
  set_item_threads_to(1);
  for (uint32_t i : unbound)
    for (uint32_t k = step.first; k < step.first + step.count; ++k) ops[k]->run_element(i, stack);
}

std::unique_ptr<ForeachSnapshot> NativeGroup::before_tier1(const std::vector<std::unique_ptr<OpWork>>& ops,
                                                           const fusion::Step& step) {
  if (step.kind != fusion::Step::kForeachGroup || state_.load(std::memory_order_acquire) != kTrial) return nullptr;
  const auto dtype = type_ == fusion::ElemType::kFloat32 ? c10::kFloat : c10::kDouble;
  const size_t np = binding_.pointers.size();
  const auto list = static_cast<uint32_t>(step.list);
  const int64_t elem = static_cast<int64_t>(c10::elementSize(dtype));
  auto snap = std::make_unique<ForeachSnapshot>();
  snap->addresses.assign(list * np, nullptr);
  std::vector<char*> ptrs(np);
  for (uint32_t i = 0; i < list; ++i) {
    const int64_t n = bind_element(ops, step, binding_, dtype, i, ptrs.data());
    if (n <= 0) continue;
    for (size_t p = 0; p < np; ++p) {
      if (!binding_.written[p]) continue;
      snap->buffers.push_back(at::empty({n}, at::TensorOptions().dtype(dtype)));
      char* copy = static_cast<char*>(snap->buffers.back().data_ptr());
      std::memcpy(copy, ptrs[p], static_cast<size_t>(n * elem));  // the state before tier 1
      snap->addresses[i * np + p] = copy;
    }
  }
  return snap;
}

void NativeGroup::trial_foreach(const std::vector<std::unique_ptr<OpWork>>& ops, const fusion::Step& step,
                                uint64_t tier1_ns, const ForeachSnapshot& snapshot) {
  const uint64_t start = steady_ns();
  run_foreach_kernel(ops, step, &snapshot);
  const uint64_t tier2_ns = steady_ns() - start;
  const auto dtype = type_ == fusion::ElemType::kFloat32 ? c10::kFloat : c10::kDouble;
  const size_t np = binding_.pointers.size();
  const size_t elem = c10::elementSize(dtype);
  std::vector<char*> ptrs(np);
  bool equal = true;
  for (uint32_t i = 0; i < static_cast<uint32_t>(step.list) && equal; ++i) {
    const int64_t n = bind_element(ops, step, binding_, dtype, i, ptrs.data());
    for (size_t p = 0; p < np && equal; ++p) {
      const char* got = snapshot.addresses[i * np + p];
      if (got == nullptr || n <= 0) continue;
      for (int64_t e = 0; e < n && equal; ++e) equal = same_value(ptrs[p] + e * elem, got + e * elem, type_);
    }
  }
  judge(equal, tier1_ns, tier2_ns);
}

}  // namespace neuron::backend
