#include "engine/op_table.h"

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <tbb/concurrent_hash_map.h>
#include <unordered_map>
#include <unordered_set>

#include "backend/direct_out.h"
#include "engine/fast_meta.h"
#include "trace/op_registry.h"
#include "trace/segmenter.h"

namespace neuron::engine {
namespace {

// Output shape depends on the data: these run at once after a sync.
const std::unordered_set<std::string>& data_dependent_ops() {
  static const std::unordered_set<std::string> ops = {
      "aten::nonzero",        "aten::_unique",           "aten::_unique2",
      "aten::unique_dim",     "aten::unique_consecutive", "aten::unique_dim_consecutive",
      "aten::masked_select",  "aten::bincount",          "aten::repeat_interleave",
      "aten::nonzero_numpy",  "aten::histogram",         "aten::_histogramdd_bin_edges",
      "aten::_histogramdd_from_bin_cts", "aten::_histogramdd_from_bin_tensors",
      "aten::histogramdd",    "aten::segment_reduce",    "aten::_segment_reduce_backward",
  };
  return ops;
}

// Ops whose Meta kernel infers other output shapes than the CPU kernel produces (empty
// auxiliary outputs on CPU): they run synchronously so results have the CPU's shapes.
const std::unordered_set<std::string>& meta_disagrees_ops() {
  static const std::unordered_set<std::string> ops = {"aten::_embedding_bag",
                                                      "aten::_embedding_bag_forward_only"};
  return ops;
}

// Ops whose CPU kernel gives outputs other strides than their Meta kernel (found by
// test_opinfo's stride comparison): their output geometry is learnt from a CPU run per
// input geometry (OpInfo::layout_from_cpu).
const std::unordered_set<std::string>& layout_from_cpu_ops() {
  static const std::unordered_set<std::string> ops = {
      "aten::_fft_r2c",     "aten::_fft_c2r",      "aten::_fft_c2c",      "aten::_linalg_svd",
      "aten::linalg_eig",   "aten::linalg_lstsq",  "aten::nonzero_static", "aten::max_unpool2d",
      "aten::max_unpool3d"};
  return ops;
}

// Out variants that leave part of a preallocated output unwritten (they zero it only when
// they resize it), or that resize the output through the input's shape on the way (CPU's
// mse_loss.out with a reduction: a deprecation warning CPU eager never shows): the
// functional kernel runs instead.
const std::unordered_set<std::string>& out_variant_denylist() {
  static const std::unordered_set<std::string> ops = {"aten::max_unpool2d", "aten::max_unpool3d",
                                                      "aten::mse_loss"};
  return ops;
}

bool is_tensor_type(const c10::TypePtr& t) { return t->kind() == c10::TypeKind::TensorType; }

bool is_tensor_list_type(const c10::TypePtr& t) {
  auto list = t->cast<c10::ListType>();
  return list && list->getElementType()->kind() == c10::TypeKind::TensorType;
}

bool is_optional_tensor_list_type(const c10::TypePtr& t) {
  auto list = t->cast<c10::ListType>();
  if (!list) return false;
  auto opt = list->getElementType()->cast<c10::OptionalType>();
  return opt && opt->getElementType()->kind() == c10::TypeKind::TensorType;
}

int find_alias_arg(const c10::FunctionSchema& s, const c10::AliasInfo& ret) {
  const auto& args = s.arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::AliasInfo* a = args[i].alias_info();
    if (a != nullptr && a->beforeSets() == ret.beforeSets()) return static_cast<int>(i);
  }
  return -1;
}

const std::unordered_map<std::string, std::vector<std::string>>& overloads() {
  static const auto* table = [] {
    auto* t = new std::unordered_map<std::string, std::vector<std::string>>();
    for (const auto& name : c10::Dispatcher::singleton().getAllOpNames())
      (*t)[name.name].push_back(name.overload_name);
    return t;
  }();
  return *table;
}

// aten::_foreach_X.o(Tensor[] self, ...) -> Tensor[] pairs with aten::_foreach_X_.o(
// Tensor(a!)[] self, ...) -> (): same arguments, the first one written.
std::optional<c10::OperatorHandle> find_foreach_inplace(const c10::FunctionSchema& s,
                                                        const OpInfo& info) {
  if (!info.write_args.empty() || s.returns().size() != 1 || !is_tensor_list_type(s.returns()[0].type()) ||
      s.arguments().empty() || !is_tensor_list_type(s.arguments()[0].type()))
    return std::nullopt;
  auto handle = c10::Dispatcher::singleton().findSchema({s.name() + "_", s.overload_name()});
  if (!handle) return std::nullopt;
  const auto& o = handle->schema();
  if (!o.returns().empty() || o.arguments().size() != s.arguments().size()) return std::nullopt;
  for (size_t i = 0; i < o.arguments().size(); ++i)
    if (*o.arguments()[i].type() != *s.arguments()[i].type()) return std::nullopt;
  const c10::AliasInfo* a = o.arguments()[0].alias_info();
  if (a == nullptr || !a->isWrite()) return std::nullopt;
  return handle;
}

std::optional<c10::OperatorHandle> find_out_variant(const c10::FunctionSchema& s,
                                                    const OpInfo& info) {
  if (s.returns().empty() || !info.write_args.empty()) return std::nullopt;
  for (const auto& r : info.returns)
    if (r.kind != ReturnInfo::kNew) return std::nullopt;
  // Ours first where ATen's would run the functional kernel and copy (backend/direct_out.h).
  if (auto direct = backend::direct_out_variant(s.name(), s.overload_name())) return direct;
  auto it = overloads().find(s.name());
  if (it == overloads().end()) return std::nullopt;
  const auto& args = s.arguments();
  for (const auto& overload : it->second) {
    if (overload == s.overload_name()) continue;
    auto handle = c10::Dispatcher::singleton().findSchema({s.name(), overload});
    if (!handle) continue;
    const auto& o = handle->schema();
    if (o.arguments().size() != args.size() + s.returns().size()) continue;
    bool ok = o.returns().size() == s.returns().size();
    for (size_t i = 0; ok && i < args.size(); ++i)
      ok = o.arguments()[i].name() == args[i].name() && *o.arguments()[i].type() == *args[i].type();
    for (size_t j = 0; ok && j < s.returns().size(); ++j) {
      const auto& out = o.arguments()[args.size() + j];
      ok = out.is_out() && *out.type() == *s.returns()[j].type();
    }
    if (ok && (handle->hasKernelForDispatchKey(c10::DispatchKey::CPU) ||
               handle->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd)))
      return handle;
  }
  return std::nullopt;
}

std::unique_ptr<OpInfo> build(const c10::OperatorHandle& op) {
  const auto& s = op.schema();
  auto info = std::make_unique<OpInfo>();
  info->name = s.name() + (s.overload_name().empty() ? "" : "." + s.overload_name());
  info->id = trace::OpRegistry::instance().intern(info->name);
  info->kind = trace::op_kind(info->name);
  const auto& args = s.arguments();
  info->foreach = info->name.rfind("aten::_foreach_", 0) == 0;
  info->arg_is_out.resize(args.size());
  info->arg_is_opt_list.resize(args.size());
  info->arg_is_liftable.resize(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].alias_info() && args[i].alias_info()->isWrite())
      info->write_args.push_back(static_cast<int>(i));
    info->arg_is_out[i] = args[i].is_out();
    info->arg_is_opt_list[i] = is_optional_tensor_list_type(args[i].type());
    const auto kind = args[i].type()->kind();
    // Scalar, float and Scalar[] values (foreach ops' per-tensor scalars) never decide shapes.
    const bool scalar_list = kind == c10::TypeKind::ListType &&
                             args[i].type()->castRaw<c10::ListType>()->getElementType()->kind() ==
                                 c10::TypeKind::NumberType;
    info->arg_is_liftable[i] = kind == c10::TypeKind::NumberType || kind == c10::TypeKind::FloatType ||
                               scalar_list;
  }
  bool all_views = !s.returns().empty();
  for (const auto& r : s.returns()) {
    ReturnInfo ri;
    ri.is_list = is_tensor_list_type(r.type());
    if (!is_tensor_type(r.type()) && !ri.is_list) {
      ri.kind = ReturnInfo::kNonTensor;
    } else if (const c10::AliasInfo* a = r.alias_info()) {
      ri.alias_arg = find_alias_arg(s, *a);
      ri.kind = a->isWrite() ? ReturnInfo::kInplace : ReturnInfo::kView;
      if (ri.alias_arg < 0) ri.kind = ReturnInfo::kNonTensor;
    }
    if (ri.kind != ReturnInfo::kView) all_views = false;
    info->returns.push_back(ri);
  }
  info->needs_work = !(all_views && info->write_args.empty());
  for (const auto& r : info->returns) {
    if (r.kind == ReturnInfo::kNonTensor) {
      info->synchronous = true;
      info->synchronous_reason = "returns a host value";
    }
  }
  if (data_dependent_ops().count(s.name())) {
    info->synchronous = true;
    info->synchronous_reason = "output shape depends on the data";
  }
  if (meta_disagrees_ops().count(s.name())) {
    info->synchronous = true;
    info->synchronous_reason = "its Meta kernel's output shapes differ from the CPU kernel's";
  }
  // Learning needs returns that are all fresh tensors (no written arguments to resize).
  if (layout_from_cpu_ops().count(s.name()) && s.overload_name().empty()) {
    info->layout_from_cpu = info->write_args.empty();
    for (const auto& r : info->returns) info->layout_from_cpu &= r.kind == ReturnInfo::kNew && !r.is_list;
  }
  info->threads = thread_rule_of(info->name);
  classify_fusible(*info);
  info->fast_meta = find_fast_meta(info->name);
  if (info->foreach) info->foreach_inplace = find_foreach_inplace(s, *info);
  if (!out_variant_denylist().count(s.name()) && !info->foreach_inplace)
    info->out_variant = find_out_variant(s, *info);
  return info;
}

// Read on every dispatch from any thread (autograd runs backward on its own threads):
// TBB's concurrent map answers lookups without a lock; inserts happen once per schema.
struct Table {
  std::mutex mark_mutex;
  tbb::concurrent_hash_map<const c10::FunctionSchema*, std::unique_ptr<OpInfo>> infos;
};

Table& table() {
  static auto* t = new Table();
  return *t;
}

OpInfo& op_info_shared(const c10::OperatorHandle& op, const c10::FunctionSchema* key) {
  Table& t = table();
  {
    decltype(t.infos)::const_accessor found;
    if (t.infos.find(found, key)) return *found->second;
  }
  auto built = build(op);
  decltype(t.infos)::accessor slot;
  if (t.infos.insert(slot, key)) slot->second = std::move(built);
  return *slot->second;
}

}  // namespace

OpInfo& op_info(const c10::OperatorHandle& op) {
  const c10::FunctionSchema* key = &op.schema();
  // A small per-thread cache in front of the shared table (entries never move or die).
  struct Entry {
    const c10::FunctionSchema* key = nullptr;
    OpInfo* info = nullptr;
  };
  thread_local std::array<Entry, 64> recent;
  Entry& e = recent[(reinterpret_cast<uintptr_t>(key) >> 4) % recent.size()];
  if (e.key == key) return *e.info;
  OpInfo& found = op_info_shared(op, key);
  e = {key, &found};
  return found;
}

void mark_synchronous(OpInfo& info, std::string reason) {
  std::lock_guard lock(table().mark_mutex);
  if (info.synchronous.load()) return;
  info.synchronous_reason = std::move(reason);
  info.synchronous.store(true, std::memory_order_release);
}

}  // namespace neuron::engine
