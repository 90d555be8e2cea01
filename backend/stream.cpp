#include "backend/stream.h"

#include <dlfcn.h>

#include <chrono>

#include "fusion/compiler_process.h"
#include "fusion/policy.h"

namespace neuron::backend {
namespace {

std::atomic<void (*)()> g_thread_init{nullptr};
std::atomic<Stream::WaitFn> g_wait_wrapper{nullptr};
std::atomic<void (*)(bool)> g_spin_hook{nullptr};
std::atomic<bool (*)()> g_idle_hook{nullptr};
std::atomic<int64_t> g_sync_yield_us{20000};

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// A host thread blocked on the device for long_wait_us frees its OpenMP team (the pool
// threads exit; its next parallel CPU op starts a new one). A host team (made by any
// parallel CPU op, such as building a model) counts against libgomp's limit for spinning
// team threads: see SpinBallast (worker_threads.cpp), which decides when worker teams spin.
void free_host_openmp_team() {
  using PauseFn = int (*)(int);
  static const auto pause = reinterpret_cast<PauseFn>(dlsym(RTLD_DEFAULT, "omp_pause_resource_all"));
  if (pause != nullptr) pause(1);  // omp_pause_soft; refused (-1) inside a parallel region
}

}  // namespace

void Stream::set_thread_init(void (*init)()) { g_thread_init.store(init); }
void Stream::set_spin_hook(void (*hook)(bool)) { g_spin_hook.store(hook); }
void Stream::set_idle_hook(bool (*hook)()) { g_idle_hook.store(hook); }
void Stream::set_wait_wrapper(WaitFn wrapper) { g_wait_wrapper.store(wrapper); }
void Stream::set_sync_yield(std::chrono::microseconds budget) { g_sync_yield_us.store(budget.count()); }

void Stream::host_wait(void (*wait)(void*), void* arg) {
  if (auto wrapper = g_wait_wrapper.load())
    wrapper(wait, arg);
  else
    wait(arg);
}

Stream::Stream(int device, int64_t id) : device_(device), id_(id) {
  worker_ = std::thread([this] { worker_loop(); });
}

Stream::~Stream() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  work_cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void Stream::enqueue(std::unique_ptr<WorkItem> item) {
  bool wake;
  {
    std::lock_guard lock(mutex_);
    queue_deferred_locked();
    queue_.push_back(std::move(item));
    enqueued_.fetch_add(1, std::memory_order_release);
    wake = worker_sleeping_;
  }
  if (wake) work_cv_.notify_one();
}

bool Stream::queue_deferred_locked() {
  if (!deferred_) return false;
  queue_.push_back(std::move(deferred_));
  has_deferred_.store(false, std::memory_order_relaxed);
  enqueued_.fetch_add(1, std::memory_order_release);
  return true;
}

void Stream::defer(std::unique_ptr<WorkItem> item) {
  std::unique_ptr<WorkItem> replaced;  // destroyed outside the lock
  std::lock_guard lock(mutex_);
  replaced = std::move(deferred_);
  deferred_ = std::move(item);
  has_deferred_.store(true, std::memory_order_release);
}

void Stream::flush_deferred() {
  if (!has_deferred_.load(std::memory_order_acquire)) return;
  bool wake;
  {
    std::lock_guard lock(mutex_);
    if (!queue_deferred_locked()) return;
    wake = worker_sleeping_;
  }
  if (wake) work_cv_.notify_one();
}

namespace {
thread_local const Stream* t_worker_stream = nullptr;
std::atomic<int64_t> g_deep_backlog{fusion::Policy{}.deep_backlog_ops};
std::atomic<int64_t> g_long_wait_ns{int64_t{fusion::Policy{}.long_wait_us} * 1000};
}  // namespace

void Stream::set_wait_limits(int64_t deep_backlog_ops, std::chrono::microseconds long_wait) {
  g_deep_backlog.store(deep_backlog_ops, std::memory_order_relaxed);
  g_long_wait_ns.store(std::chrono::nanoseconds(long_wait).count(), std::memory_order_relaxed);
}

const Stream* Stream::current_worker_stream() { return t_worker_stream; }

bool Stream::host_needs_threads() const {
  return host_waiters_.load(std::memory_order_relaxed) > 0 || pending() > g_deep_backlog.load(std::memory_order_relaxed);
}

bool Stream::host_waits_long() const {
  const int64_t since = host_blocked_since_ns_.load(std::memory_order_relaxed);
  return since != 0 && std::chrono::steady_clock::now().time_since_epoch().count() - since >=
                           g_long_wait_ns.load(std::memory_order_relaxed);
}

bool Stream::take_batch(std::vector<std::unique_ptr<WorkItem>>& batch) {
  // Spin, then yield, before sleeping: back-to-back ops cost no futex wake-up, and a
  // woken worker never waits for a time slice behind busy intra-op threads. Yielding
  // leaves the core to the dispatching host thread whenever it needs it.
  auto idle_since = std::chrono::steady_clock::now();
  bool idle_work = true;  // deferred work may be waiting for an idle worker
  for (int spin = 0;; ++spin) {
    // Polls the enqueue counter, not the mutex: a spinning worker never makes the
    // dispatching thread wait for the lock.
    if (enqueued_.load(std::memory_order_acquire) > taken_) {
      std::lock_guard lock(mutex_);
      batch.swap(queue_);
      taken_ += batch.size();
      return true;
    }
    if (idle_work && spin >= 200 &&
        std::chrono::steady_clock::now() - idle_since > std::chrono::microseconds(100)) {
      // Deferred work (thread-count trials) runs only once nothing was queued for 100 us:
      // a host dispatching a run of ops queues the next within microseconds, and a piece
      // of deferred work gives way only between its runs.
      auto hook = g_idle_hook.load(std::memory_order_relaxed);
      idle_work = hook != nullptr && hook();
      if (idle_work) {
        spin = -1;
        idle_since = std::chrono::steady_clock::now();
        continue;
      }
    }
    if (spin % 64 == 63) {
      std::lock_guard lock(mutex_);
      if (stop_) return false;
    }
    if (spin < 200) {
      cpu_relax();
    } else if (transport_.load(std::memory_order_relaxed) || g_sync_yield_us.load(std::memory_order_relaxed) == 0) {
      // A transport's next call can afford a wake-up, and its peers need the core; with no
      // sync yield the machine's cores are shared with other processes, which need them.
      break;
    } else if (fusion::children_running()) {
      // While a tier-2 compiler runs, a yield hands it the core for a whole time slice
      // (SCHED_IDLE tasks share the run queue): spin a little without yielding (the
      // host's next op is usually microseconds away), then leave the core to it.
      if (std::chrono::steady_clock::now() - idle_since > std::chrono::microseconds(100)) break;
      cpu_relax();
    } else {
      if (std::chrono::steady_clock::now() - idle_since > std::chrono::milliseconds(2)) break;
      std::this_thread::yield();
    }
  }
  std::unique_lock lock(mutex_);
  worker_sleeping_ = true;
  work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
  worker_sleeping_ = false;
  if (queue_.empty()) return false;
  batch.swap(queue_);
  taken_ += batch.size();
  return true;
}

void Stream::worker_loop() {
  t_worker_stream = this;
  if (auto init = g_thread_init.load()) init();
  // The items taken from queue_ at once (all it held), run in order: the worker takes the
  // lock the host enqueues under once per batch, not once per item. Both vectors keep
  // their capacity, so a steady stream of ops allocates nothing here.
  std::vector<std::unique_ptr<WorkItem>> batch;
  size_t next = 0;
  for (;;) {
    if (next == batch.size()) {
      batch.clear();
      next = 0;
      if (!take_batch(batch)) return;
    }
    std::unique_ptr<WorkItem> item = std::move(batch[next++]);
    const auto started = std::chrono::steady_clock::now();
    if (auto hook = g_spin_hook.load(std::memory_order_relaxed)) hook(host_waits_long());
    try {
      item->run();
    } catch (const std::exception& e) {
      std::lock_guard lock(mutex_);
      if (error_.empty()) error_ = item->describe() + " failed on neuron:" +
                                   std::to_string(device_) + ": " + e.what();
    } catch (...) {
      std::lock_guard lock(mutex_);
      if (error_.empty()) error_ = item->describe() + " failed with an unknown exception";
    }
    // Releases the item's buffers before the work counts as done.
    WorkItem* raw = item.get();
    raw->finish(std::move(item));
    busy_ns_.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::steady_clock::now() - started).count(),
                       std::memory_order_relaxed);
    completed_.fetch_add(1, std::memory_order_acq_rel);
    // Pairs with the fence in wait_until: a waiter either sees this item completed or is
    // counted here (then the lock orders the notify after its wait began).
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (waiters_.load(std::memory_order_relaxed) > 0) {
      std::lock_guard lock(mutex_);
      done_cv_.notify_all();
    }
  }
}

bool Stream::idle() const {
  if (has_deferred_.load(std::memory_order_acquire)) return false;
  return completed_.load(std::memory_order_acquire) == enqueued_.load(std::memory_order_acquire);
}

int64_t Stream::pending() const {
  return static_cast<int64_t>(enqueued_.load(std::memory_order_acquire) -
                              completed_.load(std::memory_order_acquire));
}

void Stream::synchronize() {
  flush_deferred();
  wait_until(enqueued_.load(std::memory_order_acquire));
  raise_pending_error();
}

void Stream::drain() {
  flush_deferred();
  wait_until(enqueued_.load(std::memory_order_acquire));
}

void Stream::wait_for_backlog(uint64_t backlog) {
  const uint64_t enqueued = enqueued_.load(std::memory_order_acquire);
  if (enqueued > backlog) wait_until(enqueued - backlog);
}

void Stream::wait_until(uint64_t target) {
  struct HostWaiting {
    std::atomic<int>& count;
    explicit HostWaiting(std::atomic<int>& c) : count(c) { count.fetch_add(1, std::memory_order_relaxed); }
    ~HostWaiting() { count.fetch_sub(1, std::memory_order_relaxed); }
  } waiting(host_waiters_);
  const int spins = waits_on_transport() ? 0 : 4000;
  for (int spin = 0; spin < spins && completed_.load(std::memory_order_acquire) < target; ++spin)
    cpu_relax();
  if (completed_.load(std::memory_order_acquire) >= target) return;
  const bool host = t_worker_stream == nullptr;  // a worker waiting for another stream is no host
  // A worker waiting for a transport stream makes its own stream one to sleep on too.
  struct TransportWait {
    const Stream* waiter;
    TransportWait(const Stream* w, bool on) : waiter(on ? w : nullptr) {
      if (waiter) waiter->transport_waits_.fetch_add(1, std::memory_order_relaxed);
    }
    ~TransportWait() {
      if (waiter) waiter->transport_waits_.fetch_sub(1, std::memory_order_relaxed);
    }
  } transport_wait(t_worker_stream, !host && waits_on_transport());
  struct HostBlocked {
    std::atomic<int64_t>* since;
    explicit HostBlocked(std::atomic<int64_t>* s) : since(s) {
      if (since) since->store(std::chrono::steady_clock::now().time_since_epoch().count(), std::memory_order_relaxed);
    }
    ~HostBlocked() {
      if (since) since->store(0, std::memory_order_relaxed);
    }
  } blocked(host ? &host_blocked_since_ns_ : nullptr);
  struct Wait {
    Stream* self;
    uint64_t target;
    bool host;  // a host thread: frees its OpenMP team once the wait is long
  } wait{this, target, host};
  auto block = [](void* arg) {
    auto* w = static_cast<Wait*>(arg);
    // Yield before sleeping (the GIL is released here). On a VM, a vCPU whose threads all
    // sleep is halted, and waking a thread there (libgomp's team threads wake each other
    // at every parallel region of a worker kernel; the worker wakes a sleeping host) costs
    // tens of microseconds. A yielding host keeps its core awake and gives way at once to
    // any thread runnable there. mlp_train, adaptive, 5 interleaved runs of 300 steps:
    // 2.16 ms per step (median) sleeping at once, 1.65 ms yielding first.
    const auto start = std::chrono::steady_clock::now();
    const auto long_from = start + std::chrono::nanoseconds(g_long_wait_ns.load(std::memory_order_relaxed));
    auto done = [w] { return w->self->completed_.load(std::memory_order_acquire) >= w->target; };
    bool freed = !w->host;
    // Yield only while the awaited worker computes: one that waits on a transport needs
    // no core, and the transport's threads and the peer processes do.
    // Nor while a tier-2 compiler runs (see take_batch): the loop ends once one starts.
    const int64_t budget_us = w->self->waits_on_transport() ? 0 : g_sync_yield_us.load(std::memory_order_relaxed);
    if (budget_us > 0) {
      const auto until = start + std::chrono::microseconds(budget_us);
      for (auto now = start; !done() && now < until && !fusion::children_running();
           now = std::chrono::steady_clock::now()) {
        if (!freed && now >= long_from) {
          free_host_openmp_team();
          freed = true;
        }
        std::this_thread::yield();
      }
      if (done()) return;
    }
    std::unique_lock lock(w->self->mutex_);
    w->self->waiters_.fetch_add(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (!freed && !w->self->done_cv_.wait_until(lock, long_from, done)) {
      lock.unlock();
      free_host_openmp_team();
      lock.lock();
    }
    w->self->done_cv_.wait(lock, done);
    w->self->waiters_.fetch_sub(1, std::memory_order_relaxed);
  };
  host_wait(block, &wait);
}

void Stream::raise_pending_error() {
  std::string message;
  {
    std::lock_guard lock(mutex_);
    if (error_.empty()) return;
    message.swap(error_);
  }
  throw WorkerError(message);
}

}  // namespace neuron::backend
