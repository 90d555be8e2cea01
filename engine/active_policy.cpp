// The fusion policy in force: one copy under a lock, the few fields the per-op and per-cut
// paths read as atomics, and the segmenting settings derived from it.
#include <atomic>
#include <mutex>

#include "backend/worker_threads.h"
#include "engine/adaptive_registry.h"
#include "engine/recording.h"
#include "engine/stream_state.h"
#include "fusion/policy.h"
#include "trace/op_registry.h"
#include "trace/segmenter.h"

namespace neuron::engine {
namespace {

std::mutex g_policy_mutex;
fusion::Policy g_policy;  // guarded by g_policy_mutex

std::atomic<bool> g_lift_scalars{true};
std::atomic<bool> g_policy_lists_ops{false};
std::atomic<uint64_t> g_hot_threshold{fusion::Policy{}.hot_threshold};
std::atomic<uint32_t> g_region_max_programs{fusion::Policy{}.region_max_programs};
std::atomic<int64_t> g_queue_max_ops{fusion::Policy{}.queue_max_ops};
std::atomic<uint32_t> g_hold_min_missed_ops{fusion::Policy{}.hold_min_missed_ops};
std::atomic<double> g_hold_miss_ratio{fusion::Policy{}.hold_miss_ratio};
std::atomic<uint32_t> g_settle_cuts{fusion::Policy{}.settle_cuts};
std::atomic<uint32_t> g_settle_first_ops{fusion::Policy{}.settle_first_ops};
std::atomic<uint32_t> g_settle_max_ops{fusion::Policy{}.settle_max_ops};
std::atomic<uint64_t> g_hold_bytes{fusion::Policy{}.hold_bytes};

trace::SegmentPolicy segment_policy_of(const fusion::Policy& policy) {
  std::vector<uint32_t> matmul_ops;
  auto& reg = trace::OpRegistry::instance();
  for (const auto& name : fusion::matmul_class_ops()) matmul_ops.push_back(reg.intern(name));
  return fusion::segment_policy_of(policy, matmul_ops);
}

}  // namespace

trace::SegmentPolicy current_segment_policy() {
  std::lock_guard lock(g_policy_mutex);
  return segment_policy_of(g_policy);
}

fusion::StreamTrialSettings current_stream_trial() {
  std::lock_guard lock(g_policy_mutex);
  return g_policy.stream_trial();
}

bool active_policy_lifts() { return g_lift_scalars.load(std::memory_order_relaxed); }
bool active_policy_lists_ops() { return g_policy_lists_ops.load(std::memory_order_relaxed); }
uint64_t active_hot_threshold() { return g_hot_threshold.load(std::memory_order_relaxed); }
uint32_t active_region_max_programs() {
  return g_region_max_programs.load(std::memory_order_relaxed);
}
int64_t active_queue_max_ops() { return g_queue_max_ops.load(std::memory_order_relaxed); }
uint32_t active_hold_min_missed_ops() { return g_hold_min_missed_ops.load(std::memory_order_relaxed); }
double active_hold_miss_ratio() { return g_hold_miss_ratio.load(std::memory_order_relaxed); }
uint64_t active_hold_bytes() { return g_hold_bytes.load(std::memory_order_relaxed); }
uint32_t active_settle_cuts() { return g_settle_cuts.load(std::memory_order_relaxed); }
uint32_t active_settle_stretch(uint32_t round) {
  return fusion::Policy::settle_stretch(g_settle_first_ops.load(std::memory_order_relaxed),
                                        g_settle_max_ops.load(std::memory_order_relaxed), round);
}

fusion::Policy active_policy() {
  std::lock_guard lock(g_policy_mutex);
  return g_policy;
}

void set_active_policy(const fusion::Policy& policy) {
  {
    std::lock_guard lock(g_policy_mutex);
    g_policy = policy;
  }
  g_lift_scalars = policy.lift_scalars;
  g_policy_lists_ops = !policy.fusible_ops.empty();
  g_hot_threshold = policy.hot_threshold;
  g_region_max_programs = policy.region_max_programs;
  g_queue_max_ops = policy.queue_max_ops;
  g_hold_min_missed_ops = policy.hold_min_missed_ops;
  g_hold_miss_ratio = policy.hold_miss_ratio;
  g_settle_cuts = policy.settle_cuts;
  g_settle_first_ops = policy.settle_first_ops;
  g_settle_max_ops = policy.settle_max_ops;
  g_hold_bytes = policy.hold_bytes;
  backend::set_thread_policy(policy);
  trace_cache().set_hot_threshold(policy.hot_threshold);
  // Open segments close; new segmenters follow the new policy.
  flush_all_windows();
  guard_policy_changed(policy);
  restart_segmenters();
}

}  // namespace neuron::engine
