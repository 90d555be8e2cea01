// Running one queued op on the worker: its stack rebuilt over aliases of device memory,
// the op's out= variant (or the functional op and a copy), and its OpExecute event.
#include "backend/op_work.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/List.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include "trace/op_registry.h"
#include "trace/recorder.h"

namespace neuron::backend {

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

void OpWork::run() {
  ExecuteEvent event(*this);
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  set_threads();
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
