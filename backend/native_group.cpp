#include "backend/native_group.h"
#include "backend/native_group_detail.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <unordered_map>

#include "fusion/native.h"
#include "trace/log.h"
#include "trace/op_registry.h"
#include "trace/recorder.h"

namespace neuron::backend {
using namespace detail;
namespace {

std::atomic<uint64_t> g_requested{0}, g_unsupported{0}, g_built{0}, g_build_failures{0},
    g_accepted{0}, g_rejected_slower{0}, g_rejected_mismatch{0}, g_runs{0}, g_unbound{0};

constexpr int kTrials = 3;
constexpr uint32_t kMaxBuildFailures = 3;

void emit_event(trace::EventKind kind, uint64_t key, uint64_t aux, uint64_t duration,
                const std::string& reason = "") {
  if (!trace::recording()) return;
  auto& rec = trace::Recorder::instance();
  trace::Event e;
  e.time_ns = rec.now_ns() - std::min(rec.now_ns(), duration);
  e.duration_ns = duration;
  e.kind = static_cast<uint8_t>(kind);
  e.value = reason.empty() ? key : rec.intern_string(reason);
  e.aux = aux;
  rec.emit(e);
}

// Tiles for the native kernel: only to spread the work over threads; a multiple of 64
// so the scalar tail falls where tier 1 (and ATen) put it: at the end of the tensor.
int64_t native_tile(int64_t numel) { return std::max<int64_t>(16384, (numel / 64 + 63) / 64 * 64); }


}  // namespace

namespace detail {

uint64_t steady_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

void tier2_note(uint64_t key, const std::string& what) {
  emit_event(trace::EventKind::kFallback, key, 0, 0, "tier 2: " + what);
}

char* data_of(const DeviceBuffer& storage, const trace::TensorMeta& m) {
  return static_cast<char*>(storage.data) +
         m.storage_offset * static_cast<int64_t>(c10::elementSize(static_cast<c10::ScalarType>(m.dtype)));
}

double scalar_value(const c10::IValue& v) {
  if (v.isDouble()) return v.toDouble();
  if (v.isInt()) return static_cast<double>(v.toInt());
  if (v.isBool()) return v.toBool() ? 1.0 : 0.0;
  return v.toScalar().toDouble();
}

bool same_value(const char* a, const char* b, fusion::ElemType type) {
  if (type == fusion::ElemType::kFloat32) {
    float x, y;
    std::memcpy(&x, a, 4);
    std::memcpy(&y, b, 4);
    return std::memcmp(a, b, 4) == 0 || (std::isnan(x) && std::isnan(y));
  }
  double x, y;
  std::memcpy(&x, a, 8);
  std::memcpy(&y, b, 8);
  return std::memcmp(a, b, 8) == 0 || (std::isnan(x) && std::isnan(y));
}

// The kernel element type of a group's dtype (float32 and float64 have kernels).
bool element_type(c10::ScalarType dtype, fusion::ElemType& type, std::string& why_not) {
  if (dtype == c10::kFloat)
    type = fusion::ElemType::kFloat32;
  else if (dtype == c10::kDouble)
    type = fusion::ElemType::kFloat64;
  else
    return why_not = std::string("element type ") + c10::toString(dtype) + " (float32 and float64 only)", false;
  return true;
}

void count_tier1_elements(size_t n) { g_unbound.fetch_add(n, std::memory_order_relaxed); }

}  // namespace detail

NativeCounters native_counters() {
  return {g_requested, g_unsupported, g_built, g_build_failures,
          g_accepted,  g_rejected_slower, g_rejected_mismatch, g_runs, g_unbound};
}

void reset_native_counters() {
  for (auto* c : {&g_requested, &g_unsupported, &g_built, &g_build_failures, &g_accepted,
                  &g_rejected_slower, &g_rejected_mismatch, &g_runs, &g_unbound})
    c->store(0);
}

bool NativeGroup::build_spec(const std::vector<std::unique_ptr<OpWork>>& ops,
                             const fusion::Step& step, fusion::KernelSpec& spec,
                             std::string& why_not) {
  if (step.kind == fusion::Step::kForeachGroup) return build_foreach_spec(ops, step, spec, why_not);
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
  spec.pointers = static_cast<int32_t>(binding.pointers.size());
  spec.scalars = static_cast<int32_t>(binding.scalars.size());
  binding_ = std::move(binding);
  type_ = spec.type;
  return true;
}

std::optional<std::string> NativeGroup::kernel_source(const std::vector<std::unique_ptr<OpWork>>& ops,
                                                      const fusion::Step& step, std::string& why_not) {
  fusion::KernelSpec spec;
  if (!build_spec(ops, step, spec, why_not)) return std::nullopt;
  // The formulas are ATen's own vector expressions: its vec headers define them.
  spec.headers = {"ATen/cpu/vec/vec.h", "ATen/cpu/vec/functional.h"};
  return fusion::generate_kernel_source(spec, why_not);
}

void NativeGroup::request(const std::vector<std::unique_ptr<OpWork>>& ops,
                          const fusion::Step& step) {
  std::string why_not;
  const std::optional<std::string> source = kernel_source(ops, step, why_not);
  if (!source) {
    state_.store(kUnsupported);
    g_unsupported.fetch_add(1);
    tier2_note(segment_key_, "not built: " + why_not);
    return;
  }
  state_.store(kBuilding);
  g_requested.fetch_add(1);
  const uint64_t key = segment_key_;
  emit_event(trace::EventKind::kCompileStart, key, 2, 0);
  // The callback keeps the group alive (programs can be dropped by reset_fusion_state).
  fusion::NativeCompiler::instance().submit(std::move(*source), [self = shared_from_this(), this, key](const fusion::NativeResult& r) {
    if (trace::recording()) trace::Recorder::instance().thread_id("compiler");
    emit_event(trace::EventKind::kCompileEnd, key, 2, r.build_ns);
    std::lock_guard lock(mutex_);
    kernel_key_ = r.key;
    if (r.fn == nullptr) {
      g_build_failures.fetch_add(1);
      ++build_failures_;
      // Backoff: retry after 5 s, 20 s; then give up on this group.
      retry_after_ns_ = steady_ns() + 5'000'000'000ull * (1ull << (2 * (build_failures_ - 1)));
      state_.store(build_failures_ >= kMaxBuildFailures ? kFailed : kIdle);
      tier2_note(key, "build failed (tier 1 kept): " + r.error);
      trace::log(trace::LogLevel::kWarn, "tier-2 build failed; the segment keeps running on tier 1 (retried with backoff): " + r.error);
      return;
    }
    g_built.fetch_add(1);
    fn_.store(r.fn);
    trial_tier1_.clear();
    trial_tier2_.clear();
    if (r.verified) {
      // Checked against tier 1 and kept by an earlier run (this process or the cache's).
      state_.store(kAccepted, std::memory_order_release);
      g_accepted.fetch_add(1);
      tier2_note(key, "swapped in: verified earlier (kernel " + r.key + ")");
      return;
    }
    state_.store(kTrial);
  });
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
  const int64_t tile = native_tile(numel);
  const int64_t tiles = (numel + tile - 1) / tile;
  // Tiles never depend on the thread count. Small groups stay on this thread (waking a
  // helper costs more than they take); larger ones spread once the host waits.
  if (numel * static_cast<int64_t>(ptrs.size()) < kSpreadElements) {
    set_item_threads_to(1);
    for (int64_t t = 0; t < tiles; ++t) fn(t * tile, std::min(numel, (t + 1) * tile), ptrs.data(), scalars.data());
    return;
  }
  run_free_units(tiles, [&](int64_t t) { fn(t * tile, std::min(numel, (t + 1) * tile), ptrs.data(), scalars.data()); });
}

void NativeGroup::before_first_run(const std::vector<std::unique_ptr<OpWork>>& ops,
                                   const fusion::Step& step) {
  if (probed_.load(std::memory_order_relaxed) || policy_.tier == fusion::Tier::kInstant) return;
  std::lock_guard lock(mutex_);
  if (probed_.exchange(true)) return;
  std::string why_not;
  const std::optional<std::string> source = kernel_source(ops, step, why_not);
  if (!source) return;  // after_tier1 reports why when it asks for a build
  const fusion::NativeResult r = fusion::NativeCompiler::instance().lookup(*source);
  if (r.fn == nullptr || !r.verified) return;
  kernel_key_ = r.key;
  fn_.store(r.fn);
  state_.store(kAccepted, std::memory_order_release);
  g_accepted.fetch_add(1);
  tier2_note(segment_key_, "swapped in from the cache: verified earlier (kernel " + r.key + ")");
}

bool NativeGroup::try_run(const std::vector<std::unique_ptr<OpWork>>& ops, const fusion::Step& step) {
  if (state_.load(std::memory_order_acquire) != kAccepted) return false;
  if (step.kind == fusion::Step::kForeachGroup)
    run_foreach_kernel(ops, step, nullptr);
  else
    run_kernel(ops, step, nullptr);
  g_runs.fetch_add(1, std::memory_order_relaxed);
  return true;
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
      scratch.push_back(at::empty({step.numel}, at::TensorOptions().dtype(
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
    for (int64_t i = 0; i < step.numel && equal; ++i)
      equal = same_value(want + i * elem, got + i * elem, type_);
  }
  judge(equal, tier1_ns, tier2_ns);
}

// A trial's verdict: a kernel that differs from tier 1 is dropped; after kTrials that
// matched, the faster tier stays.
void NativeGroup::judge(bool equal, uint64_t tier1_ns, uint64_t tier2_ns) {
  if (!equal) {
    state_.store(kRejected);
    g_rejected_mismatch.fetch_add(1);
    tier2_note(segment_key_, "rejected: results differ from tier 1 (kernel " + kernel_key_ + ")");
    return;
  }
  trial_tier1_.push_back(tier1_ns);
  trial_tier2_.push_back(tier2_ns);
  if (static_cast<int>(trial_tier1_.size()) < kTrials) return;
  auto median = [](std::vector<uint64_t> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const uint64_t t1 = median(trial_tier1_), t2 = median(trial_tier2_);
  const std::string timing = std::to_string(t2 / 1000.0) + " us vs tier 1 " + std::to_string(t1 / 1000.0) + " us";
  if (t2 < t1) {
    state_.store(kAccepted, std::memory_order_release);
    g_accepted.fetch_add(1);
    fusion::NativeCompiler::instance().mark_verified(kernel_key_);
    tier2_note(segment_key_, "swapped in: " + timing);
  } else {
    state_.store(kRejected);
    g_rejected_slower.fetch_add(1);
    tier2_note(segment_key_, "rejected: not faster than tier 1 (" + timing + ")");
  }
}

bool NativeGroup::run_whole_next() {
  const int c = tier1_choice_.load(std::memory_order_relaxed);
  if (c != 0) return c == 2;
  std::lock_guard lock(mutex_);
  return whole_ns_.size() <= tiled_ns_.size();  // alternate while trying
}

void NativeGroup::note_tier1(bool whole, uint64_t ns) {
  constexpr size_t kEach = 3;
  if (tier1_choice_.load(std::memory_order_relaxed) != 0) return;
  std::lock_guard lock(mutex_);
  (whole ? whole_ns_ : tiled_ns_).push_back(ns);
  if (whole_ns_.size() < kEach || tiled_ns_.size() < kEach) return;
  auto median = [](std::vector<uint64_t> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const uint64_t w = median(whole_ns_), t = median(tiled_ns_);
  tier1_choice_.store(t < w ? 1 : 2);
  tier2_note(segment_key_, std::string("tier 1 runs this group ") + (t < w ? "tile by tile" : "op by op on whole tensors") +
                               " (" + std::to_string(t / 1000.0) + " us tiled vs " + std::to_string(w / 1000.0) + " us whole)");
}

void NativeGroup::after_tier1(const std::vector<std::unique_ptr<OpWork>>& ops,
                              const fusion::Step& step, uint64_t tier1_ns,
                              const ForeachSnapshot* snapshot) {
  if (policy_.tier == fusion::Tier::kInstant) return;
  const int s = state_.load();
  if (s == kIdle) {
    std::lock_guard lock(mutex_);
    ++tier1_runs_;
    tier1_total_ns_ += tier1_ns;
    if (steady_ns() < retry_after_ns_) return;
    bool go = policy_.tier == fusion::Tier::kNative;
    if (!go && tier1_runs_ >= policy_.native_min_runs) {
      // Cost gate: measured tier-1 time x expected saving x expected repeats must beat
      // the build's cost.
      const double avg_us = static_cast<double>(tier1_total_ns_) / static_cast<double>(tier1_runs_) / 1000.0;
      go = avg_us * policy_.native_saving * policy_.expected_repeats > policy_.compile_cost_us_native;
      if (!go && tier1_runs_ == policy_.native_min_runs)
        tier2_note(segment_key_, "not built: fails the cost gate (tier 1 takes " + std::to_string(avg_us) + " us)");
    }
    if (go) request(ops, step);
  } else if (s == kTrial) {
    std::lock_guard lock(mutex_);
    if (state_.load() != kTrial) return;
    if (step.kind != fusion::Step::kForeachGroup)
      trial(ops, step, tier1_ns);
    else if (snapshot != nullptr)
      trial_foreach(ops, step, tier1_ns, *snapshot);
  }
}

}  // namespace neuron::backend
