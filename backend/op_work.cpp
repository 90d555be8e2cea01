#include "backend/op_work.h"

#include <ATen/Parallel.h>
#include <ATen/core/List.h>

#include <mutex>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <ATen/core/LegacyTypeDispatch.h>

#include "trace/op_registry.h"
#include "trace/recorder.h"

namespace neuron::backend {

bool describe_tensor(const at::Tensor& t, trace::TensorMeta& m) {
  if (!t.defined()) {
    m = trace::TensorMeta{};
    return true;
  }
  const int64_t ndim = t.dim();
  if (ndim > trace::kMaxDims) return false;
  m.defined = true;
  m.dtype = static_cast<int8_t>(t.scalar_type());
  m.ndim = static_cast<uint8_t>(ndim);
  m.device = t.device().is_cpu() ? -1 : static_cast<int8_t>(t.device().index());
  m.storage_offset = t.storage_offset();
  m.flags = static_cast<uint8_t>((t.is_conj() ? trace::TensorMeta::kConjugate : 0) |
                                 (t.is_neg() ? trace::TensorMeta::kNegative : 0) |
                                 (t.unsafeGetTensorImpl()->is_wrapped_number()
                                      ? trace::TensorMeta::kWrappedNumber
                                      : 0));
  m.storage = t.has_storage()
                  ? reinterpret_cast<uint64_t>(t.storage().unsafeGetStorageImpl())
                  : 0;
  auto sizes = t.sizes();
  auto strides = t.strides();
  for (int64_t i = 0; i < ndim; ++i) {
    m.sizes[i] = sizes[i];
    m.strides[i] = strides[i];
  }
  return true;
}

DeviceBuffer buffer_of(const c10::Storage& storage) {
  if (!storage) return {};
  return {const_cast<void*>(storage.data()), storage.nbytes(),
          reinterpret_cast<uint64_t>(storage.unsafeGetStorageImpl())};
}

at::Tensor cpu_alias(const c10::Storage& storage, const trace::TensorMeta& m) {
  return cpu_alias(buffer_of(storage), m);
}

at::Tensor cpu_alias(const DeviceBuffer& buffer, const trace::TensorMeta& m) {
  c10::Storage alias(c10::Storage::use_byte_size_t(), buffer.nbytes,
                     c10::DataPtr(buffer.data, c10::Device(c10::kCPU)),
                     /*allocator=*/nullptr, /*resizable=*/false);
  auto t = at::detail::make_tensor<c10::TensorImpl>(
      std::move(alias), c10::DispatchKeySet(c10::DispatchKey::CPU),
      c10::scalarTypeToTypeMeta(static_cast<c10::ScalarType>(m.dtype)));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(c10::IntArrayRef(m.sizes.data(), m.ndim),
                                                 c10::IntArrayRef(m.strides.data(), m.ndim),
                                                 m.storage_offset);
  if (m.flags & trace::TensorMeta::kConjugate) t._set_conj(true);
  if (m.flags & trace::TensorMeta::kNegative) t._set_neg(true);
  return t;
}

at::Tensor meta_tensor(const trace::TensorMeta& m) {
  c10::IntArrayRef sizes(m.sizes.data(), m.ndim), strides(m.strides.data(), m.ndim);
  auto options = at::TensorOptions()
                     .dtype(static_cast<c10::ScalarType>(m.dtype))
                     .device(c10::kMeta);
  auto with_flags = [&](at::Tensor t) {
    if (m.flags & trace::TensorMeta::kConjugate) t._set_conj(true);
    if (m.flags & trace::TensorMeta::kNegative) t._set_neg(true);
    return t;
  };
  if (m.storage_offset == 0) return with_flags(at::empty_strided(sizes, strides, options));
  int64_t extent = 1;
  for (int i = 0; i < m.ndim; ++i)
    if (m.sizes[i] == 0) extent = 0;
  if (extent != 0)
    for (int i = 0; i < m.ndim; ++i) extent += (m.sizes[i] - 1) * m.strides[i];
  auto base = at::empty({m.storage_offset + extent}, options);
  auto t = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(base.storage()),
                                                     base.key_set(), base.dtype());
  t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, m.storage_offset);
  return with_flags(t);
}

c10::OperatorHandle OpWork::dummy_handle() {
  static c10::OperatorHandle handle =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::empty", "memory_format");
  return handle;
}

namespace {

// Finished OpWorks, kept with their vectors' capacity: a queued op then costs no heap
// allocation for its record, arguments and outputs once the pool is warm. The host
// acquires them and a worker recycles them, so each thread keeps a batch of its own and
// meets the other at the shared pool once per kBatch items: the pool's lock and cache
// line then move between cores once per batch, not twice per op.
struct Pool {
  std::mutex mutex;
  std::vector<OpWork*> free;
  static constexpr size_t kMax = 4096;
  static constexpr size_t kBatch = 32;
};

Pool& pool() {
  static auto* p = new Pool();  // never destroyed: workers may recycle during exit
  return *p;
}

// A thread's own batch; handed back to the pool when the thread ends.
struct LocalBatch {
  std::vector<OpWork*> items;
  LocalBatch() { items.reserve(2 * Pool::kBatch); }
  ~LocalBatch() { give_back(0); }
  // Moves all but `keep` items to the pool (deleting those it has no room for).
  void give_back(size_t keep) {
    if (items.size() <= keep) return;
    Pool& p = pool();
    std::lock_guard lock(p.mutex);
    while (items.size() > keep) {
      OpWork* w = items.back();
      items.pop_back();
      if (p.free.size() < Pool::kMax) p.free.push_back(w);
      else delete w;
    }
  }
  void take_batch() {
    Pool& p = pool();
    std::lock_guard lock(p.mutex);
    for (size_t i = 0; i < Pool::kBatch && !p.free.empty(); ++i) {
      items.push_back(p.free.back());
      p.free.pop_back();
    }
  }
};

thread_local LocalBatch t_batch;

}  // namespace

std::unique_ptr<OpWork> OpWork::acquire(const c10::OperatorHandle& handle) {
  LocalBatch& b = t_batch;
  if (b.items.empty()) b.take_batch();
  if (b.items.empty()) return std::make_unique<OpWork>(handle);
  OpWork* w = b.items.back();
  b.items.pop_back();
  w->op = handle;
  return std::unique_ptr<OpWork>(w);
}

void OpWork::recycle(std::unique_ptr<OpWork> work) {
  if (!work) return;
  work->clear();
  LocalBatch& b = t_batch;
  b.items.push_back(work.release());
  if (b.items.size() >= 2 * Pool::kBatch) b.give_back(Pool::kBatch);
}

void OpWork::finish(std::unique_ptr<WorkItem> self) {
  recycle(std::unique_ptr<OpWork>(static_cast<OpWork*>(self.release())));
}

void OpWork::clear() {
  record.tensors.clear();
  seq = 0;
  threads = ThreadRule::kFixed;
  core = 0;
  stream = 0;
  values.clear();
  slots.clear();
  inputs.clear();
  output_metas.clear();
  output_storages.clear();
  output_groups.clear();
  output_is_list.clear();
  out_op.reset();
  inplace_op.reset();
  out_refused = nullptr;
}

namespace {

at::Tensor source_tensor(const TensorSource& s, const trace::TensorMeta& m) {
  if (s.storage) return cpu_alias(s.storage, m);
  return s.host;  // host tensor, or undefined
}

}  // namespace

void OpWork::build_stack(torch::jit::Stack& stack, bool with_outputs) const {
  stack.reserve(slots.size() + output_metas.size());
  push_arguments(
      stack, [&](uint32_t k) { return source_tensor(inputs[k], record.tensors[k]); },
      [&](size_t i) -> const c10::IValue& { return values[i]; });
  if (!with_outputs) return;
  size_t k = 0;
  for (size_t r = 0; r < output_groups.size(); ++r) {
    if (output_is_list[r]) {
      std::vector<at::Tensor> list;
      for (uint32_t j = 0; j < output_groups[r]; ++j, ++k)
        list.push_back(cpu_alias(output_storages[k], output_metas[k]));
      stack.emplace_back(std::move(list));
    } else {
      stack.emplace_back(cpu_alias(output_storages[k], output_metas[k]));
      ++k;
    }
  }
}

void emit_op_execute(const OpWork& work, uint64_t time_ns, uint64_t duration_ns) {
  trace::Event e;
  e.time_ns = time_ns;
  e.duration_ns = duration_ns;
  e.kind = static_cast<uint8_t>(trace::EventKind::kOpExecute);
  e.seq = work.seq;
  e.op = work.record.op;
  e.core = work.core;
  e.stream = work.stream;
  trace::Recorder::instance().emit(e);
}

namespace {

// Emits the OpExecute event of a traced op when the run ends (also on failure).
struct ExecuteEvent {
  const OpWork& work;
  uint64_t start = 0;
  explicit ExecuteEvent(const OpWork& w) : work(w) {
    if (work.seq != 0 && trace::recording()) {
      trace::Recorder::instance().thread_id("worker");
      start = trace::Recorder::instance().now_ns();
    }
  }
  ~ExecuteEvent() {
    if (start == 0 || !trace::recording()) return;
    emit_op_execute(work, start, trace::Recorder::instance().now_ns() - start);
  }
};

}  // namespace

bool contiguous(const trace::TensorMeta& m) {
  int64_t expected = 1;
  for (int i = m.ndim - 1; i >= 0; --i) {
    if (m.sizes[i] != 1 && m.strides[i] != expected) return false;
    expected *= m.sizes[i];
  }
  return true;
}

int64_t OpWork::work_elements() const {
  int64_t elements = 0;
  for (const auto& m : record.tensors) elements += m.numel();
  for (const auto& m : output_metas) elements += m.numel();
  return elements;
}

int64_t OpWork::matmul_work() const {
  // Multiply-adds over 32, in elementwise-op equivalents for kSpreadElements: output
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

void OpWork::run() {
  ExecuteEvent event(*this);
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  if (threads == ThreadRule::kMatmul) {
    // Large products take CPU eager's count even while the host is busy (the host soon
    // waits for them; one thread would leave a core idle for the rest of the product).
    const int64_t work = matmul_work();
    set_item_threads(work < kLargeMatmulWork && thread_free(), work);
  } else {
    set_item_threads(thread_free(), work_elements());
  }
  torch::jit::Stack stack;
  if (inplace_op && !slots.empty() && slots[0].kind == SlotKind::kTensorList &&
      slots[0].count == output_metas.size()) {
    const uint32_t first = slots[0].first;
    for (uint32_t k = 0; k < slots[0].count; ++k)
      cpu_alias(output_storages[k], output_metas[k]).copy_(source_tensor(inputs[first + k], record.tensors[first + k]));
    push_arguments(
        stack,
        [&](uint32_t k) {
          if (k >= first && k < first + slots[0].count) return cpu_alias(output_storages[k - first], output_metas[k - first]);
          return source_tensor(inputs[k], record.tensors[k]);
        },
        [&](size_t i) -> const c10::IValue& { return values[i]; });
    inplace_op->redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &stack);
    return;
  }
  if (out_op) {
    build_stack(stack, /*with_outputs=*/true);
    try {
      out_op->redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &stack);
      return;
    } catch (const std::exception&) {
      // A functional op leaves its inputs alone, so running it again is safe.
      if (out_refused != nullptr) out_refused->store(true, std::memory_order_relaxed);
      stack.clear();
    }
  }
  build_stack(stack, /*with_outputs=*/false);
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &stack);
  copy_results(stack);
}

void OpWork::run_element(uint32_t i, torch::jit::Stack& stack) const {
  stack.clear();
  const bool functional = inplace_op.has_value();
  if (functional)
    cpu_alias(output_storages[i], output_metas[i])
        .copy_(source_tensor(inputs[slots[0].first + i], record.tensors[slots[0].first + i]));
  for (size_t a = 0; a < slots.size(); ++a) {
    const ArgSlot& slot = slots[a];
    if (slot.kind == SlotKind::kTensorList) {
      c10::List<at::Tensor> list;
      const uint32_t k = slot.first + i;
      list.push_back(functional && a == 0 ? cpu_alias(output_storages[i], output_metas[i])
                                          : source_tensor(inputs[k], record.tensors[k]));
      stack.emplace_back(std::move(list));
    } else if (values[a].isList()) {
      c10::impl::GenericList one(values[a].toList().elementType());
      one.push_back(values[a].toListRef()[i]);
      stack.emplace_back(std::move(one));
    } else {
      stack.push_back(values[a]);
    }
  }
  (functional ? *inplace_op : op).redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &stack);
}

void OpWork::copy_results(const torch::jit::Stack& stack) const {
  if (output_metas.empty()) return;
  // Copy fresh results into our outputs. Returns that alias an argument (views,
  // in-place) have a group of zero.
  size_t k = 0;
  for (size_t r = 0; r < output_groups.size() && r < stack.size(); ++r) {
    if (output_groups[r] == 0) continue;
    const c10::IValue& v = stack[r];
    if (output_is_list[r]) {
      for (const at::Tensor& t : v.toTensorList().vec()) {
        cpu_alias(output_storages[k], output_metas[k]).copy_(t);
        ++k;
      }
    } else {
      if (output_metas[k].defined && v.isTensor())
        cpu_alias(output_storages[k], output_metas[k]).copy_(v.toTensor());
      ++k;
    }
  }
}

std::string OpWork::describe() const {
  return trace::OpRegistry::instance().name(record.op);
}

}  // namespace neuron::backend
