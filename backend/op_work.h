// Per-op execution on the simulator: a recorded op whose tensors are device storages
// plus geometry, run by the worker as an ATen CPU kernel on aliases of device memory.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/util/FunctionRef.h>

#include <atomic>
#include <optional>
#include <vector>

#include "backend/stream.h"
#include "trace/op_record.h"

namespace neuron::backend {

// Geometry and identity of a tensor; false when it cannot be described (too many dims).
bool describe_tensor(const at::Tensor& t, trace::TensorMeta& out);
// Device memory a queued item reads or writes, by address. Items own no device memory:
// the allocator frees stream-ordered (a block freed while queued work may still use it
// is reused only once that work ran, see backend::free_block), so queued work leaves the
// use counts of the program's storages alone, as on CPU (autograd accumulates a gradient
// in place only when nothing else holds its storage; a count that depended on how far
// the worker got made the op stream differ from run to run).
struct DeviceBuffer {
  void* data = nullptr;
  size_t nbytes = 0;
  uint64_t id = 0;  // the StorageImpl at dispatch (identity while the op is held)
  explicit operator bool() const { return id != 0; }
};
DeviceBuffer buffer_of(const c10::Storage& storage);

// A CPU tensor over the device memory with the given geometry; no copy, no ownership.
at::Tensor cpu_alias(const DeviceBuffer& buffer, const trace::TensorMeta& meta);
at::Tensor cpu_alias(const c10::Storage& storage, const trace::TensorMeta& meta);
// A Meta tensor with the given geometry (offset included).
at::Tensor meta_tensor(const trace::TensorMeta& meta);

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

// How a work item's bits depend on its intra-op thread count.
enum class ThreadRule : uint8_t {
  kFixed,        // they may (reductions, matmuls, FFT, ...): always CPU eager's count
  kFree,         // they never do (tile groups, layer norm: each row on one thread)
  kElementwise,  // elementwise kernels: only where ATen's split points fall on vector
                 // boundaries (checked per item, see thread_free())
  kRowLastDim,   // softmax / log_softmax (and log_softmax's backward): free over the last
                 // dim (one row per thread)
  kMatmul,       // matmuls: free where a trial per geometry finds equal bits (thread_trial.cpp)
  kReduction,    // dim reductions (sum, mean): likewise
};
// (MKL's matmuls are not free in general: a 10x64 @ 64x256 float product differs in its
// last bits between 1 and 2 threads; most shapes do not.)

// Intra-op threads for one work item on the worker. Items whose bits may depend on the
// count use CPU eager's, so BLAS, FFT and reductions split work the same way, bit for
// bit. Items whose bits do not (`free`) use one thread while the host is busy (the
// dispatching thread needs the other core: two threads on a shared core made every
// parallel region wait for a time slice) and CPU eager's count while a host thread waits
// for this stream or the stream is far behind, and the item touches at least
// kSpreadElements elements (smaller ones cost more to wake a helper for than they save).
void set_item_threads(bool free, int64_t elements);
constexpr int64_t kSpreadElements = int64_t{1} << 18;
// A matmul free of the thread count counts multiply-adds / 32 (OpWork::matmul_work):
// below kSpreadElements (8M multiply-adds) it runs on one thread even while the host
// waits (mlp_train's 64x256x256 products: waking a sleeping team thread for each cost more
// than the second core gave); from kLargeMatmulWork (16M) on it takes CPU eager's count
// even while the host is busy, as a fixed item does (the host soon waits for it, and one
// thread would leave a core idle for the rest of the product).
constexpr int64_t kLargeMatmulWork = 2 * kSpreadElements;
void set_large_item_threads(int threads);
int large_item_threads();
// Runs units [0, n) of work whose bits do not depend on which thread runs a unit: on
// this worker thread alone while the host is busy, then, as soon as a host thread waits
// for this stream (or the stream is far behind), on CPU eager's count of threads, which
// share the units left one by one. (A split fixed at the start would keep one core idle
// for the rest of the item, or make the host wait for a time slice.)
void run_free_units(int64_t n, c10::function_ref<void(int64_t)> unit);
// Exactly this many intra-op threads for the next kernels on this worker (for work whose
// bits do not depend on the count, such as elementwise kernels); the next
// set_item_threads() restores the usual count.
void set_item_threads_to(int threads);
// Whether the workers' OpenMP teams may spin between parallel regions (libgomp's full
// spin) or should sleep at once (throttled): Stream's spin hook.
void set_team_spinning(bool spin);
// The calling worker's OpenMP team: thread k's id and the CPU it keeps while a host thread
// waits for the stream (the host is then idle); while the host is busy every team thread
// may run on any of `allowed` and the scheduler keeps them off the host's CPU as it can.
void register_worker_team(std::vector<int> tids, std::vector<int> cpus, std::vector<int> allowed);
// Emits a traced op's OpExecute event (recording must be on).
class OpWork;
void emit_op_execute(const OpWork& work, uint64_t time_ns, uint64_t duration_ns);
// True when an elementwise kernel over `numel` contiguous elements gives the same bits
// at any thread count up to CPU eager's: however ATen splits it (kernels choose their own
// grain), every chunk is a whole multiple of 64 elements, so vector tails fall where one
// thread's do.
bool elementwise_split_free(int64_t numel);
// Whether a kMatmul / kReduction item's bits are equal at one thread and at CPU eager's
// count: decided once per geometry (op, sizes, strides, offsets, scalar arguments) on the
// calling worker by running the op on random inputs both ways (thread_trial.cpp).
class OpWork;
bool trial_thread_free(const OpWork& work);
struct ThreadTrialStats {
  uint64_t trials = 0;  // geometries tried
  uint64_t free = 0;    // of which equal bits: they run as free items
};
ThreadTrialStats thread_trial_stats();
void reset_thread_trial_stats();

// True when the geometry is row-major contiguous (size-1 dims may have any stride).
bool contiguous(const trace::TensorMeta& m);

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
