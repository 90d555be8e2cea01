#include "distributed/collective_work.h"

#include <ATen/core/ivalue.h>
#include <c10/core/StreamGuard.h>

#include <unordered_map>

#include "backend/runtime.h"
#include "engine/engine.h"
#include "engine/recording.h"
#include "trace/recorder.h"

namespace neuron::distributed {

void PeerTransfer::started(c10::intrusive_ptr<c10d::Work> work) {
  std::lock_guard lock(mutex_);
  work_ = std::move(work);
}

void PeerTransfer::wait() {
  c10::intrusive_ptr<c10d::Work> work;
  {
    std::lock_guard lock(mutex_);
    if (done_) return;
    work = work_;
  }
  // A transfer whose start failed has no work: its error is the start's.
  if (work) work->wait();
  std::lock_guard lock(mutex_);
  done_ = true;
  tensors_.clear();
}

bool PeerTransfer::finished() {
  std::lock_guard lock(mutex_);
  if (!done_ && work_ && work_->isCompleted()) {
    done_ = true;
    tensors_.clear();
  }
  return done_;
}

namespace {

void emit_collective(const CollectiveTrace& t, uint64_t start_ns) {
  trace::Recorder& r = trace::Recorder::instance();
  trace::Event e;
  e.time_ns = start_ns;
  e.duration_ns = r.now_ns() - start_ns;
  e.kind = static_cast<uint8_t>(trace::EventKind::kCollective);
  e.value = r.intern_string(t.op);
  e.aux = t.bytes;
  e.reserved = r.intern_string(t.group);
  e.seq = t.number;
  e.core = t.core;
  e.stream = static_cast<uint16_t>(backend::kCollectiveStream);
  r.emit(e);
}

}  // namespace

void CollectiveItem::run() {
  const bool traced = trace::recording();
  const uint64_t start_ns = traced ? trace::Recorder::instance().now_ns() : 0;
  c10::intrusive_ptr<c10d::Work> started;
  try {
    started = launch_(transport_->host());
  } catch (...) {
    if (peer_) peer_->started(nullptr);
    if (traced) emit_collective(trace_, start_ns);
    throw;
  }
  if (peer_) peer_->started(std::move(started));
  if (traced) emit_collective(trace_, start_ns);
}

void PeerWaitItem::run() {
  for (auto& p : peers_) p->wait();
}

namespace {

// Per stream: the enqueue counts just before and after the last wait Work.wait() queued
// there, and the enqueue count before the first of an unbroken run of such waits.
struct WaitMark {
  uint64_t run_start = 0;
  uint64_t after = 0;
};
std::mutex g_marks_mutex;
std::unordered_map<const backend::Stream*, WaitMark> g_marks;

}  // namespace

bool only_waits_for_collectives(const backend::Stream& stream) {
  std::lock_guard lock(g_marks_mutex);
  auto it = g_marks.find(&stream);
  if (it == g_marks.end()) return false;
  return stream.enqueued() == it->second.after && stream.completed() >= it->second.run_start;
}

NeuronWork::NeuronWork(int rank, c10d::OpType type, Issued issued)
    : c10d::Work(rank, type), issued_(std::move(issued)) {}

bool NeuronWork::isCompleted() {
  if (!issued_.end->query()) return false;
  for (auto& p : issued_.peers)
    if (!p->finished()) return false;
  return true;
}

bool NeuronWork::isSuccess() const { return true; }

bool NeuronWork::wait(std::chrono::milliseconds /*timeout: the transport's own applies*/) {
  const c10::DeviceIndex core = issued_.core;
  engine::flush_windows(core);
  backend::Stream& stream = engine::current_stream(core);
  if (!issued_.end->query()) {
    std::lock_guard lock(g_marks_mutex);
    WaitMark& mark = g_marks[&stream];
    const uint64_t before = stream.enqueued();
    issued_.end->block_deferred(stream);  // a later collective's wait covers this one
    if (mark.after != before) mark.run_start = before;  // something else was queued since
    mark.after = stream.enqueued();
  }
  if (!issued_.peers.empty())  // waits for a transfer, not for the stream: no mark
    stream.enqueue(std::make_unique<PeerWaitItem>(issued_.peers, issued_.description + " (transfer)"));
  if (issued_.blocks_host || engine::launch_blocking())
    engine::synchronize_stream(stream, issued_.blocks_host ? "barrier" : "NEURON_LAUNCH_BLOCKING");
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> NeuronWork::getFuture() {
  std::lock_guard lock(future_mutex_);
  if (future_) return future_;
  const c10::Device device(c10::DeviceType::PrivateUse1, issued_.core);
  future_ = c10::make_intrusive<c10::ivalue::Future>(
      c10::ListType::create(c10::TensorType::get()), std::vector<c10::Device>{device});
  if (issued_.peers.empty()) {
    // Recorded on the collective stream: the value is ready once the collective ran.
    c10::StreamGuard guard(c10::Stream(c10::Stream::UNSAFE, device, backend::kCollectiveStream));
    future_->markCompleted(c10::IValue(issued_.outputs));
  } else {
    wait();  // the current stream waits for the transfers
    future_->markCompleted(c10::IValue(issued_.outputs));
  }
  return future_;
}

}  // namespace neuron::distributed
