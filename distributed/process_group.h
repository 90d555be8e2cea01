// The `neuron` c10d backend: collectives on neuron tensors, queued on the core's
// collective stream like ops (see collective_work.h), moved by a Transport (Gloo today).
// torch.distributed creates it through the backend registered as "neuron"
// (python/neuron_eager/_distributed.py).
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "distributed/collective_work.h"
#include "distributed/transport.h"

namespace neuron::distributed {

class NeuronBackend final : public c10d::Backend {
 public:
  NeuronBackend(int rank, int size, std::shared_ptr<Transport> transport);

  const std::string getBackendName() const override { return "neuron"; }
  bool supportsCoalescing() const override { return true; }
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return sequence_; }

  using Tensors = std::vector<at::Tensor>;
  using TensorLists = std::vector<std::vector<at::Tensor>>;
  c10::intrusive_ptr<c10d::Work> broadcast(Tensors& tensors, const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(Tensors& tensors, const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(Tensors& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(Tensors& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(TensorLists& outputs, Tensors& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(TensorLists& outputs, Tensors& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(Tensors& outputs, Tensors& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(TensorLists& outputs, Tensors& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(Tensors& outputs, TensorLists& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(Tensors& outputs, TensorLists& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      Tensors& outputs, Tensors& inputs, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(Tensors& outputs, Tensors& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(Tensors& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(Tensors& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  // One call being issued: checks its tensors and makes their host aliases.
  class Call {
   public:
    explicit Call(const char* op) : op_(op) {}
    // A CPU alias of a neuron tensor; a clear error for any other device, another core
    // than the call's first tensor, or a tensor that is not contiguous.
    at::Tensor host(const at::Tensor& t, bool counts_bytes = true);
    Tensors host(const Tensors& ts, bool counts_bytes = true);
    TensorLists host(const TensorLists& ts, bool counts_bytes = true);
    const char* op() const { return op_; }
    c10::DeviceIndex core() const { return core_; }
    void set_core(c10::DeviceIndex core) { core_ = core; }
    size_t bytes() const { return bytes_; }

   private:
    const char* op_;
    c10::DeviceIndex core_ = -1;
    size_t bytes_ = 0;
  };

 private:
  // Queues the call on its core's collective stream (after the current stream's work) and
  // returns its Work. peer: a point-to-point call (launch returns the started transfer).
  c10::intrusive_ptr<c10d::Work> issue(const Call& call, c10d::OpType type, Tensors outputs,
                                       CollectiveItem::Launch launch, Tensors peer_tensors = {},
                                       bool peer = false, bool blocks_host = false);
  std::string describe(const Call& call) const;
  // The group's description (torch's group_desc, else its name) in errors and traces.
  std::string group_name() const;

  std::shared_ptr<Transport> transport_;
  std::mutex mutex_;  // issuing order and the coalescing block
  uint64_t sequence_ = 0;
  bool coalescing_ = false;
  std::vector<Issued> coalesced_;
  // Transfers nobody waited for yet: their tensors stay alive until they finished.
  std::vector<std::shared_ptr<PeerTransfer>> in_flight_;
};

// Checks a reduce op the transport can run: AVG runs as SUM and a division on the device.
// Returns the op to hand the transport.
c10d::ReduceOp transport_reduce_op(const c10d::ReduceOp& op, const char* call);
// After a SUM that stood for AVG: divides in place (integers truncate, as NCCL's average).
void divide_for_average(at::Tensor& host_tensor, int size);

}  // namespace neuron::distributed
