// How many intra-op threads a worker's items use, and where its OpenMP team runs: CPU
// eager's thread count for items whose bits depend on it, one thread for the others while
// the host is busy, work shared among the team once a host thread waits.
#include "backend/worker_threads.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <sched.h>

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "backend/op_thread_rule.h"
#include "backend/stream.h"
#include "trace/counters.h"

namespace neuron::backend {

namespace {
std::atomic<int> g_large_threads{1};
std::atomic<int64_t> g_spread_elements{static_cast<int64_t>(fusion::Policy{}.spread_elements)};
std::atomic<int64_t> g_large_matmul_work{static_cast<int64_t>(fusion::Policy{}.large_matmul_work)};
thread_local int t_threads = -1;
using SetThreads = void (*)(int);
SetThreads omp_setter() {
  static auto f = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
  return f;
}
}  // namespace

void set_large_item_threads(int threads) { g_large_threads.store(std::max(1, threads)); }
int large_item_threads() { return g_large_threads.load(std::memory_order_relaxed); }

void set_thread_policy(const fusion::Policy& policy) {
  g_spread_elements.store(static_cast<int64_t>(policy.spread_elements), std::memory_order_relaxed);
  g_large_matmul_work.store(static_cast<int64_t>(policy.large_matmul_work), std::memory_order_relaxed);
  Stream::set_wait_limits(policy.deep_backlog_ops, std::chrono::microseconds(policy.long_wait_us));
  set_thread_trial_policy(policy);
}
int64_t spread_elements() { return g_spread_elements.load(std::memory_order_relaxed); }
int64_t large_matmul_work() { return g_large_matmul_work.load(std::memory_order_relaxed); }

namespace {
struct TeamPlacement {
  std::vector<int> tids, cpus, allowed;
  int separate = -1;  // -1: not placed yet
};
thread_local TeamPlacement t_team;
trace::Counter g_placements{"team_placements"};  // the team put on its own CPUs

// Team threads on their own CPUs while the host waits (a team thread woken onto the
// worker's CPU halves a kernel: 256x688x256 mm 1161/1241 us against 711/720 us placed, CPU
// eager 701); free while the host works, so the scheduler can move one off a busy host's
// CPU. Placed, small-matmul training still loses (mlp_train adaptive 2.5-3.8 ms per step
// against 1.4-2.2 never placed; README).
void place_worker_team(bool separate) {
  if (t_team.tids.empty() || t_team.separate == static_cast<int>(separate)) return;
  if (separate) ++g_placements;
  for (size_t i = 0; i < t_team.tids.size(); ++i) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (separate)
      CPU_SET(t_team.cpus[i], &set);
    else
      for (int c : t_team.allowed) CPU_SET(c, &set);
    sched_setaffinity(t_team.tids[i], sizeof(set), &set);  // best effort
  }
  t_team.separate = separate;
}
}  // namespace

void register_worker_team(std::vector<int> tids, std::vector<int> cpus, std::vector<int> allowed) {
  t_team = TeamPlacement{std::move(tids), std::move(cpus), std::move(allowed), -1};
}

namespace {

trace::Counter g_team_kicks{"team_spin_stops"};  // spins of docked team threads ended when the host resumed

// Whether the worker's docked team threads spin between parallel regions. libgomp spins
// about 300000 rounds before a team thread sleeps, or about a hundred while it manages
// more threads than there are CPUs. Spinning, the team wakes at once for each parallel
// region of a worker kernel; throttled, every region pays a futex wake-up. On 2 CPUs the
// worker's team (1 thread beside the initial one) alone leaves libgomp spinning; the
// host's team, or this ballast thread's, tips it to throttled. Teams spin only while a
// host thread has been blocked for the policy's long_wait_us (and then holds no team itself):
// a spinning team thread takes a busy host's core, and a spin in progress is not cut
// short when the host resumes. paired.py, adaptive / CPU eager, 14 rounds: llama_train
// 0.78-0.82 always throttled, 0.96-0.99 spinning during long waits; llama_decode 1.34
// throttled, 0.67 always spinning (its waits are 1-3 ms: unchanged now); mlp_train 0.88
// throttled, 0.73 spinning whenever the backlog is deep (the host still dispatches).
class SpinBallast {
 public:
  // Called on a worker thread: its team's CPUs (t_team.allowed) are the process's, while
  // the worker itself may be placed on one CPU right now, a mask a new thread inherits.
  static SpinBallast& get() {
    static SpinBallast* b = new SpinBallast(t_team.allowed);  // its thread outlives static destruction
    return *b;
  }
  void want_throttle(bool throttle) {
    if (want_.exchange(throttle, std::memory_order_relaxed) == throttle) return;
    std::lock_guard lock(mutex_);
    cv_.notify_one();
  }
  // Waits (yielding, up to `limit`) until the ballast holds its team, so the docks that
  // follow are throttled. Whether it does.
  bool wait_throttled(std::chrono::microseconds limit) const {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (!have_.load(std::memory_order_acquire)) {
      if (std::chrono::steady_clock::now() >= until) return false;
      std::this_thread::yield();
    }
    return true;
  }

 private:
  explicit SpinBallast(std::vector<int> allowed) {
    std::thread([this, allowed = std::move(allowed)] { loop(allowed); }).detach();
  }
  void loop(const std::vector<int>& allowed) {
    if (!allowed.empty()) {  // before its team exists: the team threads inherit the mask
      cpu_set_t set;
      CPU_ZERO(&set);
      for (int c : allowed) CPU_SET(c, &set);
      sched_setaffinity(0, sizeof(set), &set);  // best effort
    }
    const int team = large_item_threads();
    omp_set_num_threads(team);
    bool have = false;
    for (;;) {
      bool want;
      {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [&] { return want_.load(std::memory_order_relaxed) != have; });
        want = want_.load(std::memory_order_relaxed);
      }
      if (want) {
#pragma omp parallel num_threads(team)
        { asm volatile("" ::: "memory"); }
      } else {
        omp_pause_resource_all(omp_pause_soft);
      }
      have = want;
      have_.store(have, std::memory_order_release);
    }
  }
  std::atomic<bool> want_{false};
  std::atomic<bool> have_{false};
  std::mutex mutex_;
  std::condition_variable cv_;
};

}  // namespace

void set_team_spinning(bool host_waits_long) {
  const int team = g_large_threads.load(std::memory_order_relaxed);
  if (team <= 1) return;
  // Spinning pays only while the team is placed on CPUs of its own (a large item while a
  // host thread waits). Docked unplaced, a spinning team thread shares the worker's CPU
  // with it while the worker runs the one-thread items between regions, and takes half
  // of it (robust.py seed 4242 cell 5, 64K-element ops, reads every 10, neuron eager:
  // 1.36 ms an iteration spinning, 1.0 never spinning, median of 5 paired runs).
  const bool spin = host_waits_long && t_team.separate == 1;
  thread_local int spinning = -1;
  if (static_cast<int>(spin) == spinning) return;
  const bool was_spinning = spinning == 1;
  spinning = spin;
  SpinBallast& ballast = SpinBallast::get();
  ballast.want_throttle(!spin);
  if (!was_spinning) return;
  // A team thread that docked while spinning is still in libgomp's full spin (300000
  // pauses: 7.6 ms on this VM's EPYC), which no later change of the thread count cuts
  // short. Once the ballast holds its team (docks are throttled from then on), an empty
  // region of the worker's team ends every spin in progress and docks the team again,
  // throttled. Run on the worker, outside any region.
  if (!ballast.wait_throttled(std::chrono::microseconds(2000)) || omp_in_parallel()) return;
#pragma omp parallel num_threads(team)
  { asm volatile("" ::: "memory"); }
  ++g_team_kicks;
}

void set_item_threads_to(int threads, bool may_place) {
  if (threads > 1) {
    const Stream* stream = Stream::current_worker_stream();
    const bool host_waits = stream != nullptr && stream->host_needs_threads();
    if (may_place || !host_waits) place_worker_team(host_waits);
  }
  if (threads == t_threads) return;
  if (auto f = omp_setter()) f(threads);
  t_threads = threads;
}

void set_item_threads(bool free, int64_t elements) {
  const int cpu = g_large_threads.load(std::memory_order_relaxed);
  // A small item never places the team (ATen runs it on one thread; worker_threads.h).
  if (!free || cpu == 1) return set_item_threads_to(cpu, /*may_place=*/elements >= spread_elements());
  const Stream* stream = Stream::current_worker_stream();
  const bool spread = elements >= spread_elements() && stream != nullptr && stream->host_needs_threads();
  set_item_threads_to(spread ? cpu : 1);
}

void run_free_units(int64_t n, c10::function_ref<void(int64_t)> unit) {
  const int cpu = g_large_threads.load(std::memory_order_relaxed);
  const Stream* stream = Stream::current_worker_stream();
  std::atomic<int64_t> next{0};
  auto share = [&] {
    for (int64_t u = next.fetch_add(1, std::memory_order_relaxed); u < n; u = next.fetch_add(1, std::memory_order_relaxed))
      unit(u);
  };
  set_item_threads_to(1);
  while (next.load(std::memory_order_relaxed) < n) {
    if (cpu > 1 && stream != nullptr && n - next.load(std::memory_order_relaxed) > 1 && stream->host_needs_threads()) {
      set_item_threads_to(cpu);
      at::parallel_for(0, cpu, 1, [&](int64_t, int64_t) { share(); });
      return;
    }
    const int64_t u = next.fetch_add(1, std::memory_order_relaxed);
    if (u < n) unit(u);
  }
}

bool elementwise_split_free(int64_t numel) {
  // ATen splits [0, numel) into p chunks of ceil(numel / p), p up to the thread count
  // (kernels pick their own grain, so any p may occur).
  const int64_t threads = g_large_threads.load(std::memory_order_relaxed);
  if (threads > 64) return false;
  for (int64_t p = 2; p <= threads; ++p)
    if (((numel + p - 1) / p) % 64 != 0) return false;
  return true;
}

}  // namespace neuron::backend
