// The boxed fallback: every op without a native neuron kernel lands here. It records the
// op, infers output geometry (shape cache, else the Meta kernel), allocates outputs on
// the device, queues the work on the current stream and returns at once.
#include <ATen/core/op_registration/adaption.h>
#include <c10/util/SmallVector.h>

#include <memory>

#include "backend/op_work.h"
#include "backend/runtime.h"
#include "engine/argument_recorder.h"
#include "engine/counters.h"
#include "engine/dispatch.h"
#include "engine/engine.h"
#include "engine/op_table.h"
#include "engine/recording.h"
#include "engine/shape_inference.h"
#include "engine/stream_state.h"
#include "engine/pch.h"
#include "engine/tensor_factory.h"
#include "trace/shape_cache.h"

namespace neuron::engine {
namespace {

using backend::ArgSlot;
using backend::OpWork;
using backend::SlotKind;
using trace::TensorMeta;

trace::ShapeCache& shape_cache() {
  static auto* cache = new trace::ShapeCache();
  return *cache;
}

// The outputs of a functional foreach op have the element types of its first list (so
// the in-place sibling computes in the same types).
bool same_dtypes_as_first_list(const OpWork& work) {
  if (work.slots.empty() || work.slots[0].kind != SlotKind::kTensorList ||
      work.slots[0].count != work.output_metas.size())
    return false;
  for (uint32_t k = 0; k < work.slots[0].count; ++k) {
    const TensorMeta& in = work.record.tensors[work.slots[0].first + k];
    if (!in.defined || in.dtype != work.output_metas[k].dtype) return false;
  }
  return true;
}

}  // namespace

void neuron_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  neuron_fallback(op, stack, nullptr);
}

void neuron_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack, BorrowedArgs* borrowed) {
  OpInfo& info = op_info(op);
  bump(g_counters.ops_dispatched);
  // run_synchronously pops the arguments: it gets counted references.
  auto run_now = [&] {
    if (borrowed != nullptr) borrowed->make_owned();
    run_synchronously(op, info, stack);
  };
  if (info.synchronous) return run_now();
  const bool observe = observing();
  const uint64_t start_ns = trace::recording() ? trace::Recorder::instance().now_ns() : 0;

  const size_t num_args = op.schema().arguments().size();
  auto args = torch::jit::last(*stack, num_args);
  auto work = OpWork::acquire(op);
  ArgumentRecorder recorder(info, *work);
  if (!recorder.record(args)) return run_now();
  c10::DeviceIndex device = recorder.device();
  if (device < 0) device = current_device();
  if (recorder.pending_generator_ >= 0) {
    auto& slot = work->values[static_cast<size_t>(recorder.pending_generator_)];
    const c10::IValue& original = args[static_cast<size_t>(recorder.pending_generator_)];
    at::Generator gen = original.isGenerator() ? original.toGenerator() : at::Generator();
    if (!gen.defined() || gen.device().type() == c10::DeviceType::PrivateUse1)
      slot = c10::IValue(host_generator_of(gen.defined() ? gen : default_generator(device)));
    else
      slot = original;
  }
  // A None generator argument also means "the device's default generator".
  for (size_t i = 0; i < num_args; ++i) {
    const auto& type = op.schema().arguments()[i].type();
    if (args[i].isNone() && type->kind() == c10::TypeKind::OptionalType &&
        type->castRaw<c10::OptionalType>()->getElementType()->kind() ==
            c10::TypeKind::GeneratorType)
      work->values[i] = c10::IValue(host_generator_of(default_generator(device)));
  }

  // Output geometry: shape cache, else the Meta kernel.
  thread_local std::vector<TensorMeta> outs;
  // Foreach ops' scalars (an optimizer's per-step values) never decide shapes: their
  // entries are keyed with the scalars read as zero, so every step hits.
  thread_local trace::OpRecord masked;
  const trace::OpRecord* shape_record = &work->record;
  if (info.foreach && !work->record.lifted.empty()) {
    masked.hashable = work->record.hashable;
    masked.signature = work->record.signature;
    for (uint32_t at : work->record.lifted) masked.signature[at] = 0;
    shape_record = &masked;
  }
  const uint64_t key = shape_record->hash();
  bool hit = shape_record->hashable && shape_cache().lookup(*shape_record, key, outs);
  if (hit) {
    bump(g_counters.shape_cache_hits);
  } else if (info.layout_from_cpu && shape_record->hashable) {
    // The first call with this input geometry runs now; its outputs' CPU geometry is what
    // later calls allocate.
    const trace::OpRecord record = *shape_record;
    run_now();
    const size_t n = info.returns.size();
    outs.clear();
    for (size_t r = 0; r < n && stack->size() >= n; ++r) {
      const c10::IValue& v = (*stack)[stack->size() - n + r];
      TensorMeta m;
      if (v.isTensor() && v.toTensor().defined() &&
          !backend::describe_tensor(v.toTensor(), m))
        return;
      outs.push_back(m);
    }
    shape_cache().insert(record, key, outs);
    return;
  } else {
    bump(g_counters.shape_cache_misses);
    try {
      infer_with_meta(op, info, *work, args, outs);
    } catch (const c10::NotImplementedError&) {
      mark_synchronous(info, "no Meta kernel to infer output shapes");
      return run_now();
    } catch (const std::exception&) {
      // Data-dependent meta kernels and argument errors: running on CPU now either
      // succeeds or raises the error CPU eager would raise.
      return run_now();
    }
    match_cpu_shapes(info, args, outs, *work);
    if (shape_record->hashable) shape_cache().insert(*shape_record, key, outs);
  }

  // Written arguments take their new geometry (out= resizes).
  size_t next = 0;
  for (int w : info.write_args) {
    const c10::IValue& v = args[static_cast<size_t>(w)];
    const ArgSlot& slot = work->slots[static_cast<size_t>(w)];
    auto apply = [&](const at::Tensor& t, uint32_t k) {
      const TensorMeta& m = outs[next++];
      if (!m.same_geometry(work->record.tensors[k])) {
        set_geometry(t, m);
        // Growing the storage moved it: the op writes the new block.
        work->inputs[k].storage = backend::buffer_of(t.storage());
        TensorMeta updated = m;
        updated.device = work->record.tensors[k].device;
        updated.storage = work->record.tensors[k].storage;
        work->record.tensors[k] = updated;
      }
    };
    if (v.isTensor()) {
      apply(v.toTensor(), slot.first);
    } else if (v.isTensorList()) {
      uint32_t k = slot.first;
      for (const at::Tensor& t : v.toTensorList()) apply(t, k++);
    }
  }

  // Returns: fresh outputs on the device, views over their base, in-place args as is.
  c10::SmallVector<c10::IValue, 4> results;
  bool all_outputs_defined = true;
  for (const ReturnInfo& ri : info.returns) {
    if (ri.kind == ReturnInfo::kInplace) {
      results.push_back(args[static_cast<size_t>(ri.alias_arg)]);
      work->output_groups.push_back(0);
      work->output_is_list.push_back(ri.is_list);
      continue;
    }
    auto make = [&](const TensorMeta& m, size_t list_index) -> at::Tensor {
      if (ri.kind == ReturnInfo::kView) {
        bump(g_counters.views);
        const c10::IValue& base = args[static_cast<size_t>(ri.alias_arg)];
        const at::Tensor& b = base.isTensor() ? base.toTensor()
                                              : base.toTensorList().get(list_index);
        if (observe) note_view(b);
        return view_of(b, m);
      }
      work->output_metas.push_back(m);
      if (!m.defined) {  // e.g. gradients masked off in a backward op
        work->output_storages.emplace_back();
        all_outputs_defined = false;
        return at::Tensor();
      }
      at::Tensor t = empty_like_meta(m, device);
      work->output_storages.push_back(backend::buffer_of(t.storage()));
      return t;
    };
    if (ri.is_list) {
      const size_t count = static_cast<size_t>(outs[next++].storage_offset);
      std::vector<at::Tensor> list;
      for (size_t j = 0; j < count; ++j) list.push_back(make(outs[next++], j));
      work->output_groups.push_back(ri.kind == ReturnInfo::kNew ? count : 0);
      work->output_is_list.push_back(true);
      results.emplace_back(std::move(list));
    } else {
      // Undefined outputs stay Tensor-typed IValues: unboxed callers unpack them as tensors.
      results.emplace_back(make(outs[next++], 0));
      work->output_groups.push_back(ri.kind == ReturnInfo::kNew ? 1 : 0);
      work->output_is_list.push_back(false);
    }
  }

  if (info.needs_work) {
    work->threads = info.threads;
    if (info.foreach_inplace && all_outputs_defined && same_dtypes_as_first_list(*work))
      work->inplace_op = info.foreach_inplace;
    if (info.out_variant && all_outputs_defined &&
        !info.out_refused.load(std::memory_order_relaxed)) {
      work->out_op = info.out_variant;
      work->out_refused = &info.out_refused;
    }
    backend::Stream& stream = current_stream(device);
    if (observe && !settled_op(device, stream.id())) {
      work->seq = next_seq();
      work->core = static_cast<uint8_t>(device);
      work->stream = static_cast<uint16_t>(stream.id());
      thread_local std::vector<at::Tensor> fresh;
      fresh.clear();
      for (size_t r = 0; r < info.returns.size(); ++r) {
        if (info.returns[r].kind != ReturnInfo::kNew) continue;
        const c10::IValue& v = results[r];
        if (v.isTensor()) fresh.push_back(v.toTensor());
        if (v.isTensorList())
          for (const at::Tensor& t : v.toTensorList()) fresh.push_back(t);
      }
      note_dispatch(work, info, device, stream.id(), start_ns, fresh);
      fresh.clear();
    }
    if (work) stream.enqueue(std::move(work));
    bump(g_counters.ops_queued);
    // Backpressure, as a CUDA launch queue gives: a host far ahead of the worker only
    // piles up memory (a freed block waits for the work queued before its free, so each
    // step ahead takes fresh blocks, and their first touch page-faults). No engine lock is
    // held here. The bound is the policy's queue_max_ops.
    if (const int64_t bound = active_queue_max_ops(); stream.pending() > bound) stream.wait_for_backlog(bound / 2);
    if (launch_blocking()) synchronize_stream(stream, "NEURON_LAUNCH_BLOCKING");
  }
  if (borrowed != nullptr)
    borrowed->drop();
  else
    torch::jit::drop(*stack, num_args);
  for (auto& r : results) stack->push_back(std::move(r));
}

void clear_shape_cache() { shape_cache().clear(); }

}  // namespace neuron::engine
