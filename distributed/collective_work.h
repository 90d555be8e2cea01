// A collective as the collective stream runs it, and the c10d::Work the caller gets back.
//
// Issuing a collective queues, NCCL-style: an event on the caller's current stream, a wait
// for it on the core's collective stream (backend::kCollectiveStream), the transport call
// there, and an end event after it. The host never blocks; Work::wait() makes the current
// stream wait for the end event. Collectives run one after another on that stream (the
// item waits for its transfer); a point-to-point operation only starts there, and wait()
// also queues a wait for its transfer on the current stream, so a send and a recv issued
// in either order on two ranks never deadlock.
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/event.h"
#include "backend/stream.h"
#include "distributed/transport.h"

namespace neuron::distributed {

// A point-to-point transfer started on the collective stream. It keeps its device tensors
// alive until the transfer finished, whether or not anyone waits for it.
class PeerTransfer {
 public:
  explicit PeerTransfer(std::vector<at::Tensor> tensors) : tensors_(std::move(tensors)) {}
  // On the collective stream's worker: the transport's started work.
  void started(c10::intrusive_ptr<c10d::Work> work);
  // Blocks until the transfer finished; throws the transport's error. Only after the
  // collective stream ran the start (callers order themselves after its end event).
  void wait();
  bool finished();

 private:
  std::mutex mutex_;
  c10::intrusive_ptr<c10d::Work> work_;
  std::vector<at::Tensor> tensors_;
  bool done_ = false;
};

// What a collective's trace event names (trace::EventKind::kCollective).
struct CollectiveTrace {
  const char* op = "";
  uint64_t bytes = 0;
  std::string group;
  uint64_t number = 0;  // the group's call number
  uint8_t core = 0;
};

// The item the collective stream runs. launch runs the transport call on host aliases:
// a collective waits for its transfer inside launch and returns null; a point-to-point
// call returns the started work, handed to peer.
class CollectiveItem final : public backend::WorkItem {
 public:
  using Launch = std::function<c10::intrusive_ptr<c10d::Work>(c10d::Backend& host)>;
  CollectiveItem(std::shared_ptr<Transport> transport, Launch launch, std::string description,
                 std::shared_ptr<PeerTransfer> peer, CollectiveTrace trace)
      : transport_(std::move(transport)), launch_(std::move(launch)),
        description_(std::move(description)), peer_(std::move(peer)), trace_(std::move(trace)) {}
  void run() override;
  std::string describe() const override { return description_; }

 private:
  std::shared_ptr<Transport> transport_;
  Launch launch_;
  std::string description_;
  std::shared_ptr<PeerTransfer> peer_;
  CollectiveTrace trace_;
};

// What Work::wait() queues on the current stream for point-to-point transfers.
class PeerWaitItem final : public backend::WorkItem {
 public:
  PeerWaitItem(std::vector<std::shared_ptr<PeerTransfer>> peers, std::string description)
      : peers_(std::move(peers)), description_(std::move(description)) {}
  void run() override;
  std::string describe() const override { return description_; }

 private:
  std::vector<std::shared_ptr<PeerTransfer>> peers_;
  std::string description_;
};

// Whether the stream's queued work is only waits for the collective stream (Work.wait()
// after collectives, nothing else since): then a new collective need not wait for it, as
// the collective stream runs in order. Keeps a loop of blocking collectives from bouncing
// between the two workers on every call.
bool only_waits_for_collectives(const backend::Stream& stream);

// The queued collectives of one call (or of one coalesced block), as c10d sees them.
struct Issued {
  c10::DeviceIndex core = 0;
  std::shared_ptr<backend::Event> end;  // recorded on the collective stream after the call
  std::vector<at::Tensor> outputs;
  std::vector<std::shared_ptr<PeerTransfer>> peers;
  std::string description;
  bool blocks_host = false;  // barrier: wait() returns once every rank reached it
};

class NeuronWork final : public c10d::Work {
 public:
  NeuronWork(int rank, c10d::OpType type, Issued issued);
  // True once the collective ran on the device (and every transfer finished).
  bool isCompleted() override;
  bool isSuccess() const override;
  std::vector<at::Tensor> result() override { return issued_.outputs; }
  // Orders the current stream after the collective; the host waits only for a barrier
  // (or under NEURON_LAUNCH_BLOCKING). Errors surface at the next sync, naming the call.
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void synchronize() override { wait(); }
  void blockCurrentStream() override { wait(); }
  // A future on `neuron` (stream-ordered like CUDA's): complete for the host at once,
  // its value ready on the device after the collective.
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

 private:
  Issued issued_;
  std::mutex future_mutex_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace neuron::distributed
