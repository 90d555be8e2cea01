// Per-op execution on the simulator: a recorded op whose tensors are device storages
// plus geometry, run by the worker as an ATen CPU kernel on aliases of device memory.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <atomic>
#include <optional>
#include <vector>

#include "backend/op_thread_rule.h"
#include "backend/stream.h"
#include "backend/tensor_alias.h"
#include "backend/worker_threads.h"
#include "trace/op_record.h"

namespace neuron::backend {

// Where one tensor argument comes from when the worker runs the op.
struct TensorSource {
  DeviceBuffer storage;  // device memory; empty for host or undefined tensors
  at::Tensor host;       // host tensor captured at dispatch
};

enum class SlotKind : uint8_t { kValue, kTensor, kTensorList, kOptionalTensorList };

// One schema argument: a plain value copied from the template, or tensors taken from
// the record's metas [first, first + count).
struct ArgSlot {
  SlotKind kind = SlotKind::kValue;
  uint32_t first = 0;
  uint32_t count = 0;
};

// Emits a traced op's OpExecute event (recording must be on).
class OpWork;
void emit_op_execute(const OpWork& work, uint64_t time_ns, uint64_t duration_ns);

class OpWork final : public WorkItem {
 public:
  void run() override;
  std::string describe() const override;
  // Back to the pool once run: storages dropped now, vectors keep their capacity.
  void finish(std::unique_ptr<WorkItem> self) override;
  // Drops held storages and tensors but keeps capacity, for reuse.
  void clear();

  // An OpWork for op from the pool (allocations of earlier ops reused), or a new one.
  static std::unique_ptr<OpWork> acquire(const c10::OperatorHandle& op);
  // Clears work and keeps it for acquire() (deletes it when the pool is full).
  static void recycle(std::unique_ptr<OpWork> work);

  c10::OperatorHandle op;          // the op itself, run on CPU
  std::optional<c10::OperatorHandle> out_op;  // its out= variant, writing into our outputs
  // A functional foreach op's in-place sibling: inputs of the first list are copied into
  // the outputs, which it then updates (no temporaries, no copy back).
  std::optional<c10::OperatorHandle> inplace_op;
  // Set when the out variant refused (it resized its outputs, say): the op then runs
  // functionally and later dispatches skip the out variant.
  std::atomic<bool>* out_refused = nullptr;
  trace::OpRecord record;          // op id and input metas, as recorded at dispatch
  std::vector<c10::IValue> values; // template per argument; tensor slots hold None
  std::vector<ArgSlot> slots;      // per argument
  std::vector<TensorSource> inputs;            // parallel to record.tensors
  std::vector<trace::TensorMeta> output_metas; // fresh outputs to fill, in return order
  std::vector<DeviceBuffer> output_storages;   // parallel to output_metas
  std::vector<uint32_t> output_groups;         // per return: how many outputs (lists > 1)
  std::vector<bool> output_is_list;            // per return
  uint64_t seq = 0;                            // op sequence number when traced, else 0
  ThreadRule threads = ThreadRule::kFixed;
  uint8_t core = 0;
  uint16_t stream = 0;

  OpWork() : op(dummy_handle()) {}
  OpWork(const c10::OperatorHandle& handle) : op(handle) {}

  // Foreach ops: runs the op on element i of every list (and of every per-tensor scalar
  // list), in place on the device tensors (a functional op through inplace_op on its
  // outputs). The per-tensor kernels are the ones the whole-list op runs.
  void run_element(uint32_t i, torch::jit::Stack& stack) const;

  // Whether this op's bits are the same at any intra-op thread count (its rule applied
  // to its tensors).
  bool thread_free() const;
  // Sets the worker's intra-op threads for this op (set_item_threads with its rule).
  void set_threads() const;
  // Elements the op reads and writes (inputs plus fresh outputs).
  int64_t work_elements() const;
  // A matmul's work in element-op equivalents (for the spread threshold).
  int64_t matmul_work() const;

  // Pushes the op's arguments (no out= arguments): plain values from value_of(i) for
  // argument i, tensors from tensor_of(k) for record.tensors[k], lists rebuilt. The one
  // place that turns a recorded op back into a stack (CPU run, Meta run, tiles).
  template <typename TensorOf, typename ValueOf>
  void push_arguments(torch::jit::Stack& stack, TensorOf&& tensor_of, ValueOf&& value_of) const;

 private:
  static c10::OperatorHandle dummy_handle();
  void build_stack(torch::jit::Stack& stack, bool with_outputs) const;
  void copy_results(const torch::jit::Stack& stack) const;
};

template <typename TensorOf, typename ValueOf>
void OpWork::push_arguments(torch::jit::Stack& stack, TensorOf&& tensor_of,
                            ValueOf&& value_of) const {
  for (size_t i = 0; i < slots.size(); ++i) {
    const ArgSlot& slot = slots[i];
    switch (slot.kind) {
      case SlotKind::kValue:
        stack.push_back(value_of(i));
        break;
      case SlotKind::kTensor: {
        at::Tensor t = tensor_of(slot.first);
        if (t.defined())
          stack.emplace_back(std::move(t));
        else
          stack.emplace_back();
        break;
      }
      case SlotKind::kTensorList: {
        c10::List<at::Tensor> list;
        list.reserve(slot.count);
        for (uint32_t k = slot.first; k < slot.first + slot.count; ++k) list.push_back(tensor_of(k));
        stack.emplace_back(std::move(list));
        break;
      }
      case SlotKind::kOptionalTensorList: {
        c10::List<std::optional<at::Tensor>> list;
        list.reserve(slot.count);
        for (uint32_t k = slot.first; k < slot.first + slot.count; ++k) {
          at::Tensor t = tensor_of(k);
          list.push_back(t.defined() ? std::optional<at::Tensor>(std::move(t)) : std::nullopt);
        }
        stack.emplace_back(std::move(list));
        break;
      }
    }
  }
}

}  // namespace neuron::backend
