// Events order work across streams and time it: record() queues a marker, block()
// queues a wait, query()/synchronize() look from the host. Queued markers hold a
// shared_ptr, so destroying an event with work in flight is safe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>

#include "backend/stream.h"

namespace neuron::backend {

class Event : public std::enable_shared_from_this<Event> {
 public:
  explicit Event(int device) : device_(device) {}
  void record(Stream& stream);
  void block(Stream& stream);
  // block(), held back until the stream's next item or sync (Stream::defer): for waits a
  // later one covers, such as the end of each collective on the in-order collective stream.
  void block_deferred(Stream& stream);
  bool query() const;
  void synchronize();
  // Milliseconds between this event's completion and end's.
  double elapsed_ms(const Event& end) const;
  bool was_recorded() const { return recorded_.load() > 0; }
  int device() const { return device_; }

 private:
  friend class EventMarker;
  friend class EventWait;
  void complete(uint64_t generation);
  void wait_for(uint64_t generation);

  const int device_;
  std::atomic<uint64_t> recorded_{0};
  std::atomic<uint64_t> completed_{0};
  std::chrono::steady_clock::time_point completed_at_{};
  mutable std::mutex mutex_;
  std::condition_variable cv_;
};

}  // namespace neuron::backend
