// A NeuronCore queue: work items run in FIFO order on one worker thread per stream,
// like a CUDA stream. Errors raised by an item are kept and surface at the next sync.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace neuron::backend {

// One unit of queued work: a per-op execution, a copy, an event marker, later a fused
// segment. run() executes on the worker; describe() names it in errors and traces.
class WorkItem {
 public:
  virtual ~WorkItem() = default;
  virtual void run() = 0;
  virtual std::string describe() const = 0;
  // Called on the worker once the item ran, with the item's own ownership: releases what
  // it holds (before the item counts as done). Items may keep themselves for reuse.
  virtual void finish(std::unique_ptr<WorkItem> self) { self.reset(); }
};

// The error a sync raises when queued work failed.
class WorkerError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Stream {
 public:
  Stream(int device, int64_t id);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  void enqueue(std::unique_ptr<WorkItem> item);
  // Holds a wait item back: it is queued just before the next item enqueued here, or when
  // a sync, drain or query needs it. A later defer() replaces a held item; the caller
  // guarantees the new one covers it (Work.wait()s on one in-order collective stream: the
  // latest collective's end covers the earlier ones). A loop of blocking collectives then
  // queues one wait on the current stream, not one per call, each waking its worker.
  void defer(std::unique_ptr<WorkItem> item);
  // Queues a held item now (see defer).
  void flush_deferred();
  // Waits until everything queued so far ran; throws WorkerError for a failed item.
  void synchronize();
  // Waits like synchronize() but keeps any error for the next sync.
  void drain();
  // Waits until at most `backlog` items are queued or running (errors stay for the next
  // sync). Not for the stream's own worker.
  void wait_for_backlog(uint64_t backlog);
  // True when nothing is queued, held (defer) or running.
  bool idle() const;
  // Items queued and not yet finished.
  int64_t pending() const;
  uint64_t completed() const { return completed_.load(std::memory_order_acquire); }
  uint64_t enqueued() const { return enqueued_.load(std::memory_order_acquire); }
  // Nanoseconds the worker spent running items (and releasing their buffers) since the
  // stream began or the last reset: the device's busy time.
  int64_t busy_ns() const { return busy_ns_.load(std::memory_order_relaxed); }
  void reset_busy() { busy_ns_.store(0, std::memory_order_relaxed); }
  // True while a host thread waits for this stream, or while more than deep_backlog_ops items
  // are queued: then the host has no use for a core, and free items (set_item_threads)
  // may take CPU eager's thread count.
  bool host_needs_threads() const;
  // True while a host thread has been blocked on this stream for at least long_wait_us: the
  // host will not need a core soon (a deep backlog alone is no sign: the host may still
  // be dispatching).
  bool host_waits_long() const;
  // The policy's deep_backlog_ops and long_wait_us for every stream (set_thread_policy).
  static void set_wait_limits(int64_t deep_backlog_ops, std::chrono::microseconds long_wait);
  // The stream whose worker is the calling thread; null on other threads.
  static const Stream* current_worker_stream();
  // Throws the kept error, if any, and clears it.
  void raise_pending_error();

  int device() const { return device_; }
  int64_t id() const { return id_; }

  // Marks a stream whose items wait on another process (collectives over a transport). A
  // wait for it, or for a stream whose worker is waiting for it, sleeps at once instead of
  // yielding its core first: what it waits on is the transport's threads and the peers,
  // which need that core. Set once, before the stream gets work.
  void mark_transport() { transport_.store(true, std::memory_order_relaxed); }
  // True when a wait for this stream should sleep at once (see mark_transport).
  bool waits_on_transport() const {
    return transport_.load(std::memory_order_relaxed) || transport_waits_.load(std::memory_order_relaxed) > 0;
  }

  // Called once on each new worker thread before it runs items (the engine sets up
  // per-thread state there, such as the intra-op thread count).
  static void set_thread_init(void (*init)());
  // Called on a worker before each item with host_waits_long().
  static void set_spin_hook(void (*hook)(bool host_waits_long));
  // Called on a worker whose queue is empty, before it spins or sleeps: runs one piece of
  // deferred work (a thread-count trial) and returns whether it did; called again until it
  // returns false. It should give up as soon as work_arrived().
  static void set_idle_hook(bool (*hook)());
  // On this stream's worker: whether items were queued since it last took a batch.
  bool work_arrived() const { return enqueued_.load(std::memory_order_acquire) > taken_; }
  // How long a host thread waiting for this stream yields its core before it sleeps.
  static void set_sync_yield(std::chrono::microseconds budget);
  // Wraps every blocking wait of a host thread (the Python bindings release the GIL there,
  // so a worker that drops the last reference to a Python-owned object can finish).
  using WaitFn = void (*)(void (*wait)(void*), void* arg);
  static void set_wait_wrapper(WaitFn wrapper);
  // Runs wait(arg) on a host thread through the wait wrapper.
  static void host_wait(void (*wait)(void*), void* arg);

 private:
  void worker_loop();
  // Waits for queued items and moves them all into `batch` (empty on entry); false when
  // the stream stops with nothing queued.
  bool take_batch(std::vector<std::unique_ptr<WorkItem>>& batch);
  void wait_until(uint64_t target);
  // Moves a held item (defer) into queue_, mutex_ held; false when none is held.
  bool queue_deferred_locked();

  const int device_;
  const int64_t id_;
  std::atomic<bool> transport_{false};
  mutable std::atomic<int> transport_waits_{0};  // > 0 while the worker waits for a transport stream
  mutable std::mutex mutex_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::vector<std::unique_ptr<WorkItem>> queue_;
  std::unique_ptr<WorkItem> deferred_;  // under mutex_ (defer)
  std::atomic<bool> has_deferred_{false};
  bool worker_sleeping_ = false;
  // Threads blocked on done_cv_ (changed under mutex_): the worker takes the mutex to
  // notify only when one is, not after every item.
  std::atomic<int> waiters_{0};
  std::atomic<int> host_waiters_{0};  // host threads in wait_until, spinning or blocked
  std::atomic<int64_t> host_blocked_since_ns_{0};  // steady clock; 0: no host thread blocked
  bool stop_ = false;
  std::atomic<uint64_t> enqueued_{0};
  uint64_t taken_ = 0;  // items the worker took from queue_ (worker thread only)
  std::atomic<uint64_t> completed_{0};
  std::atomic<int64_t> busy_ns_{0};
  std::string error_;  // first failure since the last sync
  std::thread worker_;
};

}  // namespace neuron::backend
