// The life cycle of a group's tier-2 kernel: the cost gate, the background build (with
// retries), the cache probe, the trial verdict, and tier 1's tiled-or-whole choice.
#include "backend/native_group.h"
#include "backend/native_group_detail.h"

#include <algorithm>

#include "fusion/native.h"
#include "trace/counters.h"
#include "trace/log.h"
#include "trace/recorder.h"

namespace neuron::backend {
using namespace detail;
namespace {

trace::Counter g_requested{"native_requested"}, g_unsupported{"native_unsupported"}, g_built{"native_built"},
    g_build_failures{"native_build_failures"}, g_accepted{"native_accepted"},
    g_rejected_slower{"native_rejected_slower"}, g_rejected_mismatch{"native_rejected_mismatch"},
    g_runs{"native_runs"},
    g_unbound{"native_foreach_tier1_elements"};  // list elements a foreach kernel left to tier 1

}  // namespace

namespace detail {
void count_tier1_elements(size_t n) { g_unbound.fetch_add(n, std::memory_order_relaxed); }
}  // namespace detail

std::optional<std::string> NativeGroup::kernel_source(const std::vector<std::unique_ptr<OpWork>>& ops,
                                                      const fusion::Step& step, std::string& why_not) {
  fusion::KernelSpec spec;
  if (!build_spec(ops, step, spec, why_not)) return std::nullopt;
  // The formulas are ATen's own vector expressions: its vec headers define them.
  spec.headers = {"ATen/cpu/vec/vec.h", "ATen/cpu/vec/functional.h"};
  return fusion::generate_kernel_source(spec, why_not);
}

bool NativeGroup::keep_binding(NativeBinding binding, fusion::KernelSpec& spec) {
  spec.pointers = static_cast<int32_t>(binding.pointers.size());
  spec.scalars = static_cast<int32_t>(binding.scalars.size());
  binding_ = std::move(binding);
  type_ = spec.type;
  return true;
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
  emit_tier2_event(trace::EventKind::kCompileStart, key, 2, 0);
  // The callback keeps the group alive (programs can be dropped by reset_fusion_state).
  fusion::NativeCompiler::instance().submit(std::move(*source), [self = shared_from_this(), this, key](const fusion::NativeResult& r) {
    if (trace::recording()) trace::Recorder::instance().thread_id("compiler");
    emit_tier2_event(trace::EventKind::kCompileEnd, key, 2, r.build_ns);
    std::lock_guard lock(mutex_);
    kernel_key_ = r.key;
    if (r.fn == nullptr) {
      g_build_failures.fetch_add(1);
      ++build_failures_;
      // Backoff (by default retried after 5 s, 20 s; then the group stays on tier 1).
      const uint64_t now = steady_ns(), delay = policy_.native_retry_delay_ns(build_failures_);
      retry_after_ns_ = delay > UINT64_MAX - now ? UINT64_MAX : now + delay;
      state_.store(policy_.native_gives_up(build_failures_) ? kFailed : kIdle);
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

// A trial's verdict: a kernel that differs from tier 1 is dropped; after native_trials that
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
  if (trial_tier1_.size() < policy_.native_trials) return;
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

bool NativeGroup::tier2_needs_runs() {
  if (state_.load() != kIdle || policy_.tier == fusion::Tier::kInstant) return false;
  std::lock_guard lock(mutex_);
  return build_failures_ == 0 && tier1_runs_ < policy_.native_min_runs;
}

bool NativeGroup::run_whole_next() {
  const int c = tier1_choice_.load(std::memory_order_relaxed);
  if (c != 0) return c == 2;
  std::lock_guard lock(mutex_);
  return whole_ns_.size() <= tiled_ns_.size();  // alternate while trying
}

void NativeGroup::note_tier1(bool whole, uint64_t ns) {
  const size_t each = policy_.tier1_choice_runs;
  if (tier1_choice_.load(std::memory_order_relaxed) != 0) return;
  std::lock_guard lock(mutex_);
  (whole ? whole_ns_ : tiled_ns_).push_back(ns);
  if (whole_ns_.size() < each || tiled_ns_.size() < each) return;
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
    if (policy_.should_build_native(tier1_total_ns_, tier1_runs_)) {
      request(ops, step);
    } else if (tier1_runs_ == policy_.native_min_runs) {
      const double avg_us = static_cast<double>(tier1_total_ns_) / static_cast<double>(tier1_runs_) / 1000.0;
      tier2_note(segment_key_, "not built: fails the cost gate (tier 1 takes " + std::to_string(avg_us) + " us)");
    }
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
