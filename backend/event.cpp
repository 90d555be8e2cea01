#include "backend/event.h"

#include <memory>
#include <string>

namespace neuron::backend {

class EventMarker final : public WorkItem {
 public:
  EventMarker(std::shared_ptr<Event> event, uint64_t generation) : event_(std::move(event)), generation_(generation) {}
  void run() override { event_->complete(generation_); }
  std::string describe() const override { return "event record"; }

 private:
  std::shared_ptr<Event> event_;
  uint64_t generation_;
};

class EventWait final : public WorkItem {
 public:
  EventWait(std::shared_ptr<Event> event, uint64_t generation) : event_(std::move(event)), generation_(generation) {}
  void run() override { event_->wait_for(generation_); }
  std::string describe() const override { return "event wait"; }

 private:
  std::shared_ptr<Event> event_;
  uint64_t generation_;
};

void Event::record(Stream& stream) {
  const uint64_t generation = recorded_.fetch_add(1) + 1;
  stream.enqueue(std::make_unique<EventMarker>(shared_from_this(), generation));
}

void Event::block(Stream& stream) {
  const uint64_t generation = recorded_.load();
  if (generation == 0 || completed_.load() >= generation) return;
  stream.enqueue(std::make_unique<EventWait>(shared_from_this(), generation));
}

void Event::block_deferred(Stream& stream) {
  const uint64_t generation = recorded_.load();
  if (generation == 0 || completed_.load() >= generation) return;
  stream.defer(std::make_unique<EventWait>(shared_from_this(), generation));
}

bool Event::query() const { return completed_.load() >= recorded_.load(); }

void Event::synchronize() {
  struct Wait {
    Event* self;
    uint64_t generation;
  } wait{this, recorded_.load()};
  Stream::host_wait([](void* arg) {
    auto* w = static_cast<Wait*>(arg);
    w->self->wait_for(w->generation);
  }, &wait);
}

void Event::complete(uint64_t generation) {
  {
    std::lock_guard lock(mutex_);
    completed_at_ = std::chrono::steady_clock::now();
    if (completed_.load() < generation) completed_.store(generation);
  }
  cv_.notify_all();
}

void Event::wait_for(uint64_t generation) {
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [&] { return completed_.load() >= generation; });
}

double Event::elapsed_ms(const Event& end) const {
  std::scoped_lock lock(mutex_, end.mutex_);
  return std::chrono::duration<double, std::milli>(end.completed_at_ - completed_at_).count();
}

}  // namespace neuron::backend
