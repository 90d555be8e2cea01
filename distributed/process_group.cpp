#include "distributed/process_group.h"

#include <ATen/ops/div.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <sstream>

#include "backend/runtime.h"
#include "backend/tensor_alias.h"
#include "engine/engine.h"
#include "engine/recording.h"

namespace neuron::distributed {

NeuronBackend::NeuronBackend(int rank, int size, std::shared_ptr<Transport> transport)
    : c10d::Backend(rank, size), transport_(std::move(transport)) {
  TORCH_CHECK(transport_, "neuron process group: no transport");
}

at::Tensor NeuronBackend::Call::host(const at::Tensor& t, bool counts_bytes) {
  TORCH_CHECK(t.defined(), "neuron process group: ", op_, " got an undefined tensor");
  TORCH_CHECK(t.device().type() == c10::DeviceType::PrivateUse1, "neuron process group: ", op_,
              " got a tensor on ", t.device(),
              "; the 'neuron' backend takes neuron tensors only (for CPU tensors give the group "
              "a CPU backend too, e.g. init_process_group(\"cpu:gloo,neuron:neuron\"))");
  TORCH_CHECK(t.layout() == c10::kStrided, "neuron process group: ", op_, " got a ", t.layout(),
              " tensor; only dense (strided) tensors are supported");
  if (core_ < 0) core_ = t.device().index();
  TORCH_CHECK(t.device().index() == core_, "neuron process group: ", op_, " got tensors on neuron:", static_cast<int>(core_),
              " and ", t.device(), "; one call takes tensors of one NeuronCore");
  TORCH_CHECK(t.is_contiguous(t.suggest_memory_format()), "neuron process group: ", op_,
              " got a non-contiguous tensor (sizes ", t.sizes(), ", strides ", t.strides(),
              "); pass tensor.contiguous()");
  trace::TensorMeta meta;
  TORCH_CHECK(backend::describe_tensor(t, meta), "neuron process group: ", op_, " got a tensor with more than ",
              trace::kMaxDims, " dimensions");
  if (counts_bytes) bytes_ += t.nbytes();
  return backend::cpu_alias(t.storage(), meta);
}

NeuronBackend::Tensors NeuronBackend::Call::host(const Tensors& ts, bool counts_bytes) {
  Tensors out;
  out.reserve(ts.size());
  for (const auto& t : ts) out.push_back(host(t, counts_bytes));
  return out;
}

NeuronBackend::TensorLists NeuronBackend::Call::host(const TensorLists& ts, bool counts_bytes) {
  TensorLists out;
  out.reserve(ts.size());
  for (const auto& list : ts) out.push_back(host(list, counts_bytes));
  return out;
}

std::string NeuronBackend::describe(const Call& call) const {
  std::ostringstream s;
  s << "c10d " << call.op() << " #" << sequence_ << " (" << call.bytes() << " bytes, rank " << getRank()
    << " of " << getSize() << ", group '" << group_name() << "', " << transport_->name() << ")";
  return s.str();
}

std::string NeuronBackend::group_name() const { return pg_desc_.empty() ? pg_uid_ : pg_desc_; }

c10::intrusive_ptr<c10d::Work> NeuronBackend::issue(const Call& call, c10d::OpType type, Tensors outputs,
                                                    CollectiveItem::Launch launch, Tensors peer_tensors,
                                                    bool peer, bool blocks_host) {
  const c10::DeviceIndex core = call.core() >= 0 ? call.core() : engine::current_device();
  std::lock_guard lock(mutex_);
  ++sequence_;
  Issued issued;
  issued.core = core;
  issued.description = describe(call);
  issued.outputs = std::move(outputs);
  issued.blocks_host = blocks_host;
  std::shared_ptr<PeerTransfer> transfer;
  if (peer) {
    transfer = std::make_shared<PeerTransfer>(std::move(peer_tensors));
    std::erase_if(in_flight_, [](const auto& p) { return p->finished(); });
    in_flight_.push_back(transfer);
    issued.peers.push_back(transfer);
  }
  // Ops an adaptive window holds go first, and the collective closes the open segments
  // (a barrier in the op stream: no segment contains it).
  engine::flush_windows(core, trace::CutReason::kBarrier);
  backend::Stream& current = engine::current_stream(core);
  backend::Stream& comm = backend::stream(core, backend::kCollectiveStream);
  // The collective reads what the current stream's queued work writes: the collective
  // stream waits for it (nothing to wait for when that stream is idle, or only waits for
  // earlier collectives).
  if (!current.idle() && !only_waits_for_collectives(current)) {
    auto start = std::make_shared<backend::Event>(core);
    start->record(current);
    start->block(comm);
  }
  CollectiveTrace trace{call.op(), call.bytes(), group_name(), sequence_, static_cast<uint8_t>(core)};
  comm.enqueue(std::make_unique<CollectiveItem>(transport_, std::move(launch), issued.description,
                                                transfer, std::move(trace)));
  issued.end = std::make_shared<backend::Event>(core);
  issued.end->record(comm);
  if (coalescing_) coalesced_.push_back(issued);
  if (engine::launch_blocking()) engine::synchronize_stream(comm, "NEURON_LAUNCH_BLOCKING");
  return c10::make_intrusive<NeuronWork>(getRank(), type, std::move(issued));
}

void NeuronBackend::startCoalescing() {
  std::lock_guard lock(mutex_);
  TORCH_CHECK(!coalescing_, "neuron process group: startCoalescing called twice without endCoalescing");
  coalescing_ = true;
  coalesced_.clear();
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::endCoalescing() {
  std::unique_lock lock(mutex_);
  TORCH_CHECK(coalescing_, "neuron process group: endCoalescing without startCoalescing");
  coalescing_ = false;
  Issued all;
  all.core = coalesced_.empty() ? engine::current_device() : coalesced_.front().core;
  all.description = "c10d coalesced block";
  for (auto& i : coalesced_) {
    TORCH_CHECK(i.core == all.core, "neuron process group: a coalesced block spans neuron:", static_cast<int>(all.core),
                " and neuron:", static_cast<int>(i.core), "; one block takes tensors of one NeuronCore");
    all.outputs.insert(all.outputs.end(), i.outputs.begin(), i.outputs.end());
    all.peers.insert(all.peers.end(), i.peers.begin(), i.peers.end());
  }
  // The collective stream runs in order: the last call's end is the block's end.
  if (!coalesced_.empty()) {
    all.end = coalesced_.back().end;
  } else {
    all.end = std::make_shared<backend::Event>(all.core);
    all.end->record(backend::stream(all.core, backend::kCollectiveStream));
  }
  coalesced_.clear();
  return c10::make_intrusive<NeuronWork>(getRank(), c10d::OpType::COALESCED, std::move(all));
}

c10d::ReduceOp transport_reduce_op(const c10d::ReduceOp& op, const char* call) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
    case c10d::ReduceOp::PRODUCT:
    case c10d::ReduceOp::MIN:
    case c10d::ReduceOp::MAX:
    case c10d::ReduceOp::BAND:
    case c10d::ReduceOp::BOR:
    case c10d::ReduceOp::BXOR:
      return op;
    case c10d::ReduceOp::AVG:
      return c10d::ReduceOp(c10d::ReduceOp::SUM);
    default:
      TORCH_CHECK(false, "neuron process group: ", call, " does not support reduce op ", static_cast<int>(op.op_),
                  " (PREMUL_SUM); allowed: SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR");
  }
}

void divide_for_average(at::Tensor& host_tensor, int size) {
  if (c10::isIntegralType(host_tensor.scalar_type(), /*includeBool=*/true))
    host_tensor.div_(size, "trunc");
  else
    host_tensor.div_(size);
}

}  // namespace neuron::distributed
