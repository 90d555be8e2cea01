// Matmuls and dim reductions whose bits turn out not to depend on the intra-op thread
// count, per geometry. MKL splits most products over rows or columns (each output element
// keeps its reduction order at any count), but not all: a 10x64 @ 64x256 float product
// differs in its last bits between 1 and 2 threads. So per geometry (op, sizes, strides,
// offsets, scalar arguments) the worker runs the op on random inputs of that geometry
// once on one thread and once on CPU eager's count, twice; equal bits in every output
// element make the geometry free. A different reduction order shows up in nearly every
// one of thousands of elements, so outputs under thread_trial_min_output elements stay fixed. A
// geometry is tried after its third sighting, while the worker is idle (a trial runs the op
// four times on fresh random inputs: inline, each new geometry of a shape-changing program
// cost its step milliseconds); until the verdict it runs as fixed.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/empty.h>

#include <atomic>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <unordered_map>

#include "backend/op_thread_rule.h"
#include "backend/op_work.h"
#include "backend/stream.h"
#include "fusion/policy.h"
#include "trace/counters.h"

namespace neuron::backend {
namespace {

// The policy's thread_trial_* knobs (set_thread_policy).
std::atomic<int64_t> g_min_output{fusion::Policy{}.thread_trial_min_output};
std::atomic<int> g_runs{static_cast<int>(fusion::Policy{}.thread_trial_runs)};
std::atomic<int> g_sightings{static_cast<int>(fusion::Policy{}.thread_trial_sightings)};

// Per geometry: how often it was seen (1 .. sightings - 1), then the verdict. Shapes that
// never recur (a batch size new at every step) never pay for a trial.
constexpr int8_t kFree = 100, kFixed = -1, kDeferred = 101;
thread_local std::unordered_map<uint64_t, int8_t> t_verdicts;
// Geometries waiting for the worker's idle time: a copy of the item's op, metas and plain
// arguments (no device memory), oldest first. Bounded: beyond it a geometry stays fixed.
struct DeferredTrial {
  std::unique_ptr<OpWork> work;
  uint64_t key;
  int gave_way = 0;  // attempts abandoned because an item was queued
};
thread_local std::deque<DeferredTrial> t_deferred;
constexpr size_t kMaxDeferred = 256;
// A geometry whose trial gave way this often (a worker never idle for long enough) stays
// fixed: each attempt costs its random inputs at least.
constexpr int kMaxGiveWays = 8;
trace::Counter g_trials{"thread_trials"}, g_free{"thread_free_geometries"};  // geometries tried, found free
trace::Counter g_deferred{"thread_trials_deferred"};  // geometries queued for a trial in idle time
trace::Counter g_given_up{"thread_trials_given_up"};  // of which left fixed: never idle long enough

bool floating(int8_t dtype) {
  switch (static_cast<c10::ScalarType>(dtype)) {
    case c10::ScalarType::Float:
    case c10::ScalarType::Double:
    case c10::ScalarType::Half:
    case c10::ScalarType::BFloat16:
      return true;
    default:
      return false;
  }
}

bool eligible(const OpWork& w) {
  if (!w.record.hashable || w.output_metas.empty() || w.inplace_op) return false;
  for (const auto& m : w.record.tensors)
    if (m.defined && (!floating(m.dtype) || m.flags != 0)) return false;
  for (const auto& m : w.output_metas)
    if (!m.defined || !floating(m.dtype) || m.numel() < g_min_output.load(std::memory_order_relaxed)) return false;
  for (const auto& s : w.slots)
    if (s.kind != SlotKind::kValue && s.kind != SlotKind::kTensor) return false;
  return true;
}

// Random values laid out as `m` is: same sizes, strides and storage offset (so the same
// alignment as a device tensor, whose base is aligned as CPU memory is).
at::Tensor random_like(const trace::TensorMeta& m, at::Generator& gen) {
  if (!m.defined) return at::Tensor();
  int64_t extent = m.storage_offset + 1;
  for (int i = 0; i < m.ndim; ++i) {
    if (m.sizes[i] == 0) return at::empty({0}, at::TensorOptions().dtype(static_cast<c10::ScalarType>(m.dtype)));
    extent += (m.sizes[i] - 1) * m.strides[i];
  }
  at::Tensor base = at::empty({extent}, at::TensorOptions().dtype(static_cast<c10::ScalarType>(m.dtype)));
  base.uniform_(-2.0, 2.0, gen);  // a different reduction order shows in any such values
  return base.as_strided(c10::IntArrayRef(m.sizes.data(), m.ndim),
                         c10::IntArrayRef(m.strides.data(), m.ndim), m.storage_offset);
}

std::vector<at::Tensor> run_at(const OpWork& w, const std::vector<at::Tensor>& inputs, int threads) {
  set_item_threads_to(threads);
  torch::jit::Stack stack;
  w.push_arguments(
      stack, [&](uint32_t k) { return inputs[k]; }, [&](size_t i) -> const c10::IValue& { return w.values[i]; });
  w.op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &stack);
  std::vector<at::Tensor> out;
  for (const auto& v : stack)
    if (v.isTensor()) out.push_back(v.toTensor().contiguous());
  return out;
}

bool same_bits(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].sizes() != b[i].sizes() || a[i].scalar_type() != b[i].scalar_type()) return false;
    if (std::memcmp(a[i].const_data_ptr(), b[i].const_data_ptr(), a[i].nbytes()) != 0) return false;
  }
  return true;
}

// The verdict, or nullopt when an item was queued meanwhile (the trial gives way).
std::optional<bool> trial(const OpWork& w, int threads) {
  const Stream* stream = Stream::current_worker_stream();
  auto arrived = [&] { return stream != nullptr && stream->work_arrived(); };
  const int runs = g_runs.load(std::memory_order_relaxed);
  for (int t = 0; t < runs; ++t) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(0x5eed + static_cast<uint64_t>(t));
    std::vector<at::Tensor> inputs;
    inputs.reserve(w.record.tensors.size());
    for (const auto& m : w.record.tensors) inputs.push_back(random_like(m, gen));
    if (arrived()) return std::nullopt;
    std::vector<at::Tensor> one = run_at(w, inputs, 1);
    if (arrived()) return std::nullopt;
    if (!same_bits(one, run_at(w, inputs, threads))) return false;
  }
  return true;
}

}  // namespace

bool trial_thread_free(const OpWork& w) {
  const int threads = large_item_threads();
  if (threads <= 1) return true;
  const uint64_t key = w.record.hash();
  int8_t& state = t_verdicts[key];
  if (state == kFree) return true;
  if (state == kFixed || state == kDeferred) return false;
  if (++state < g_sightings.load(std::memory_order_relaxed)) return false;  // a geometry that recurs is worth a trial
  if (!eligible(w) || t_deferred.size() >= kMaxDeferred) {
    state = kFixed;
    return false;
  }
  auto copy = OpWork::acquire(w.op);
  copy->record = w.record;
  copy->values = w.values;
  copy->slots = w.slots;
  copy->output_metas = w.output_metas;
  t_deferred.push_back({std::move(copy), key});
  ++g_deferred;
  state = kDeferred;
  return false;
}

bool run_deferred_thread_trial() {
  if (t_deferred.empty()) return false;
  DeferredTrial& job = t_deferred.front();
  std::optional<bool> free;
  try {
    free = trial(*job.work, large_item_threads());
  } catch (const std::exception&) {
    free = false;  // the item itself reports its error when it runs
  }
  if (!free.has_value()) {  // work arrived: the trial waits for the next idle time
    if (++job.gave_way < kMaxGiveWays) return false;
    free = false;
    ++g_given_up;
  } else {
    ++g_trials;
    if (*free) ++g_free;
  }
  t_verdicts[job.key] = *free ? kFree : kFixed;
  OpWork::recycle(std::move(job.work));
  t_deferred.pop_front();
  return true;
}

void set_thread_trial_policy(const fusion::Policy& policy) {
  g_min_output.store(static_cast<int64_t>(policy.thread_trial_min_output), std::memory_order_relaxed);
  g_runs.store(static_cast<int>(policy.thread_trial_runs), std::memory_order_relaxed);
  g_sightings.store(static_cast<int>(policy.thread_trial_sightings), std::memory_order_relaxed);
}


}  // namespace neuron::backend
