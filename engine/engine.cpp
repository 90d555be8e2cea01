#include "engine/engine.h"

#include <malloc.h>
#include <cstdlib>

#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "backend/runtime.h"
#include "backend/op_work.h"
#include "engine/counters.h"
#include "engine/pch.h"
#include "engine/recording.h"
#include "fusion/policy.h"
#include "trace/counters.h"
#include "trace/log.h"

namespace neuron::engine {

void register_device_hooks();      // device.cpp
void register_cpu_kernel_routes();  // cpu_routes.cpp
void register_fast_ops();          // fast_ops.cpp (before the CPU kernel routes)

namespace {

std::once_flag g_init_once;
Config g_config;
std::atomic<bool> g_initialized{false};
std::atomic<Mode> g_mode{Mode::kEager};
std::atomic<bool> g_launch_blocking{false};

// The worker's OpenMP team, registered for placement (backend::register_worker_team):
// thread k on CPU base + k while a host thread waits, worker k starting k CPUs further.
void pin_worker_team() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return;
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  const int team = std::min<int>(at::get_num_threads(), static_cast<int>(cpus.size()));
  if (team < 2) return;
  static std::atomic<int> workers{0};
  const int base = workers.fetch_add(1);
  backend::set_item_threads_to(team);
  // One index per team thread: ATen gives chunk k of [0, team) to OpenMP thread k, and the
  // pool keeps these threads for the worker's later parallel regions.
  std::vector<int> tids(static_cast<size_t>(team), 0), placed(static_cast<size_t>(team));
  at::parallel_for(0, team, 1, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) tids[static_cast<size_t>(k)] = static_cast<int>(gettid());
  });
  for (int k = 0; k < team; ++k) placed[static_cast<size_t>(k)] = cpus[static_cast<size_t>((base + k) % static_cast<int>(cpus.size()))];
  if (std::find(tids.begin(), tids.end(), 0) != tids.end()) return;  // the region ran short
  backend::register_worker_team(std::move(tids), std::move(placed), std::move(cpus));
}

// Workers set their OpenMP thread count per item (backend::set_item_threads): CPU eager's
// count (or NEURON_WORKER_THREADS) for items whose bits depend on it; one thread for the
// others while the host is busy.
// ATen's temporaries (and tier 1's whole-tensor runs) allocate and free buffers of
// megabytes per op. glibc maps each such buffer afresh until its adaptive mmap threshold
// has grown past the size, so a process's first few hundred ops on large tensors paid page
// faults on every buffer: fused segments ran 2-4x slower in their first ~10 runs (chain_cache,
// 512x1024: 9-30 ms, then 5.5 ms; 6.5-8.5 ms from the first run with these settings).
// A user's own MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ win.
void keep_freed_host_buffers() {
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") == nullptr) mallopt(M_MMAP_THRESHOLD, 32 << 20);
  if (std::getenv("MALLOC_TRIM_THRESHOLD_") == nullptr) mallopt(M_TRIM_THRESHOLD, 256 << 20);
}

void init_worker_thread() {
  at::init_num_threads();
  if (g_config.pin_workers) pin_worker_team();
  backend::set_item_threads(false, 0);
}

}  // namespace

CounterBlock g_counters;

const Config& init_from_env() {
  std::string error;
  std::call_once(g_init_once, [&] {
    auto parsed = config_from_env(error);
    if (!parsed) return;
    g_config = *parsed;
    // Before any policy is made: every policy, built-in or read, starts with it.
    fusion::set_default_numerics(g_config.fast_numerics ? fusion::Numerics::kFast : fusion::Numerics::kExact);
    if (g_config.fast_numerics) set_active_policy(fusion::Policy{});  // the default, now fast
    if (!g_config.policy_path.empty()) {
      auto policy = fusion::load_policy_file(g_config.policy_path, error);
      if (!policy) {
        error = "NEURON_FUSION_POLICY: " + error;
        return;
      }
      set_active_policy(*policy);
    }
    trace::LogLevel level;
    if (trace::parse_log_level(g_config.log_level, level)) trace::set_log_level(level);
    g_mode = g_config.mode;
    g_launch_blocking = g_config.launch_blocking;
    backend::set_large_item_threads(g_config.worker_threads > 0 ? g_config.worker_threads
                                                                 : at::get_num_threads());
    backend::Stream::set_thread_init(&init_worker_thread);
    backend::Stream::set_spin_hook(&backend::set_team_spinning);
    backend::Stream::set_idle_hook(&backend::run_deferred_thread_trial);
    backend::Stream::set_sync_yield(std::chrono::microseconds(g_config.sync_yield_us));
    backend::init(backend::RuntimeConfig{g_config.cores, g_config.hbm_bytes});
    keep_freed_host_buffers();
    register_device_hooks();
    register_fast_ops();
    register_cpu_kernel_routes();
    g_initialized = true;
    if (g_config.local_rank >= 0) set_default_device(static_cast<c10::DeviceIndex>(g_config.local_rank % g_config.cores));
    if (!g_config.trace_path.empty()) start_trace(g_config.trace_path);
    if (g_config.mode == Mode::kAdaptive)
      trace::log(trace::LogLevel::kDebug,
                 "NEURON_EAGER_MODE=adaptive: fused segments are not built yet; ops run per op "
                 "as in eager mode");
  });
  if (!g_initialized) {
    if (error.empty()) {
      // A previous call failed; parse again for the message.
      config_from_env(error);
    }
    throw std::invalid_argument(error.empty() ? "neuron: engine failed to initialise" : error);
  }
  return g_config;
}

bool initialized() { return g_initialized.load(); }
const Config& config() { return g_config; }

Mode mode() { return g_mode.load(); }
void set_mode(Mode m) {
  g_mode = m;
  if (m == Mode::kAdaptive)
    trace::log(trace::LogLevel::kDebug,
               "adaptive mode selected: fused segments are not built yet; ops run per op");
}
bool launch_blocking() { return g_launch_blocking.load(std::memory_order_relaxed); }
void set_launch_blocking(bool on) { g_launch_blocking = on; }

int device_count() {
  if (!g_initialized) init_from_env();
  return g_config.cores;
}

void check_device_index(c10::DeviceIndex index) {
  TORCH_CHECK(index >= 0 && index < device_count(), "neuron: invalid device index ", int(index),
              "; this process has ", device_count(), " NeuronCores (NEURON_CORES)");
}

void synchronize_stream(backend::Stream& stream, const char* cause) {
  g_counters.syncs.fetch_add(1, std::memory_order_relaxed);
  SyncScope scope(static_cast<c10::DeviceIndex>(stream.device()), cause);
  try {
    stream.synchronize();
  } catch (const backend::WorkerError& e) {
    TORCH_CHECK(false, "neuron: an asynchronously executed op failed: ", e.what());
  }
}

void synchronize(c10::DeviceIndex index, const char* cause) {
  g_counters.syncs.fetch_add(1, std::memory_order_relaxed);
  SyncScope scope(index, cause);
  try {
    backend::synchronize_core(index);
  } catch (const backend::WorkerError& e) {
    TORCH_CHECK(false, "neuron: an asynchronously executed op failed: ", e.what());
  }
}

void synchronize_all(const char* cause) {
  if (!g_initialized) return;
  for (int i = 0; i < device_count(); ++i) synchronize(static_cast<c10::DeviceIndex>(i), cause);
}

Counters counters() {
  Counters c;
  c.ops_dispatched = g_counters.ops_dispatched.load();
  c.ops_queued = g_counters.ops_queued.load();
  c.ops_synchronous = g_counters.ops_synchronous.load();
  c.meta_runs = g_counters.meta_runs.load();
  c.fast_meta_runs = g_counters.fast_meta_runs.load();
  c.shape_cache_hits = g_counters.shape_cache_hits.load();
  c.shape_cache_misses = g_counters.shape_cache_misses.load();
  c.views = g_counters.views.load();
  c.syncs = g_counters.syncs.load();
  return c;
}

void reset_counters() {
  g_counters.reset();
  trace::reset_registered_counters();  // the controller's, the guard's, tier 2's, ...
  backend::reset_busy_time();
}

}  // namespace neuron::engine
