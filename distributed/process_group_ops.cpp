// The collective and point-to-point calls of the `neuron` backend: each checks its tensors,
// makes their host aliases and queues the transport call (process_group.cpp: issue).
#include <c10/util/Exception.h>

#include "distributed/process_group.h"

namespace neuron::distributed {
namespace {

using Tensors = NeuronBackend::Tensors;
using TensorLists = NeuronBackend::TensorLists;

Tensors flatten(const TensorLists& lists) {
  Tensors out;
  for (const auto& l : lists) out.insert(out.end(), l.begin(), l.end());
  return out;
}

bool is_average(const c10d::ReduceOp& op) { return op.op_ == c10d::ReduceOp::AVG; }

// Checks that need no peer, made at the call as NCCL makes them (the transport would only
// find them on the worker, and a rank that fails alone leaves its peers waiting).
void check_same_dtype(const char* call, const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "neuron process group: ", call, " got ", a.scalar_type(),
              " and ", b.scalar_type(), " tensors; input and output must have one dtype");
}

void check_numel(const char* call, const char* what, int64_t got, int64_t expected) {
  TORCH_CHECK(got == expected, "neuron process group: ", call, ": ", what, " has ", got, " elements, expected ",
              expected);
}

}  // namespace

c10::intrusive_ptr<c10d::Work> NeuronBackend::broadcast(Tensors& tensors, const c10d::BroadcastOptions& opts) {
  Call call("broadcast");
  Tensors host = call.host(tensors);
  return issue(call, c10d::OpType::BROADCAST, tensors, [host, opts](c10d::Backend& b) mutable {
    b.broadcast(host, opts)->wait();
    return c10::intrusive_ptr<c10d::Work>();
  });
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::allreduce(Tensors& tensors, const c10d::AllreduceOptions& opts) {
  Call call("allreduce");
  Tensors host = call.host(tensors);
  c10d::AllreduceOptions o = opts;
  o.reduceOp = transport_reduce_op(opts.reduceOp, call.op());
  const bool average = is_average(opts.reduceOp);
  const int size = getSize();
  return issue(call, c10d::OpType::ALLREDUCE, tensors, [host, o, average, size](c10d::Backend& b) mutable {
    b.allreduce(host, o)->wait();
    if (average)
      for (auto& t : host) divide_for_average(t, size);
    return c10::intrusive_ptr<c10d::Work>();
  });
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::allreduce_coalesced(Tensors& tensors,
                                                                  const c10d::AllreduceCoalescedOptions& opts) {
  Call call("allreduce_coalesced");
  Tensors host = call.host(tensors);
  c10d::AllreduceCoalescedOptions o = opts;
  o.reduceOp = transport_reduce_op(opts.reduceOp, call.op());
  const bool average = is_average(opts.reduceOp);
  const int size = getSize();
  return issue(call, c10d::OpType::ALLREDUCE_COALESCED, tensors, [host, o, average, size](c10d::Backend& b) mutable {
    b.allreduce_coalesced(host, o)->wait();
    if (average)
      for (auto& t : host) divide_for_average(t, size);
    return c10::intrusive_ptr<c10d::Work>();
  });
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::reduce(Tensors& tensors, const c10d::ReduceOptions& opts) {
  Call call("reduce");
  Tensors host = call.host(tensors);
  c10d::ReduceOptions o = opts;
  o.reduceOp = transport_reduce_op(opts.reduceOp, call.op());
  const bool average = is_average(opts.reduceOp) && opts.rootRank == getRank();
  const int size = getSize();
  return issue(call, c10d::OpType::REDUCE, tensors, [host, o, average, size](c10d::Backend& b) mutable {
    b.reduce(host, o)->wait();
    if (average)
      for (auto& t : host) divide_for_average(t, size);
    return c10::intrusive_ptr<c10d::Work>();
  });
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::allgather(TensorLists& outputs, Tensors& inputs,
                                                        const c10d::AllgatherOptions& opts) {
  Call call("allgather");
  TORCH_CHECK(inputs.size() == 1 && outputs.size() == 1, "neuron process group: allgather takes one input "
              "tensor and one output list (got ", inputs.size(), " and ", outputs.size(), ")");
  TORCH_CHECK(static_cast<int>(outputs[0].size()) == getSize(), "neuron process group: allgather got ",
              outputs[0].size(), " output tensors for a group of ", getSize());
  for (const auto& o : outputs[0]) {
    check_same_dtype(call.op(), inputs[0], o);
    check_numel(call.op(), "an output tensor", o.numel(), inputs[0].numel());
  }
  Tensors in = call.host(inputs);
  TensorLists out = call.host(outputs, false);
  return issue(call, c10d::OpType::ALLGATHER, flatten(outputs), [out, in, opts](c10d::Backend& b) mutable {
    b.allgather(out, in, opts)->wait();
    return c10::intrusive_ptr<c10d::Work>();
  });
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                              const c10d::AllgatherOptions& opts) {
  Call call("allgather_into_tensor");
  check_same_dtype(call.op(), input, output);
  check_numel(call.op(), "the output", output.numel(), input.numel() * getSize());
  at::Tensor in = call.host(input);
  at::Tensor out = call.host(output, false);
  return issue(call, c10d::OpType::_ALLGATHER_BASE, {output}, [out, in, opts](c10d::Backend& b) mutable {
    b._allgather_base(out, in, opts)->wait();
    return c10::intrusive_ptr<c10d::Work>();
  });
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::allgather_coalesced(TensorLists& outputs, Tensors& inputs,
                                                                  const c10d::AllgatherOptions& opts) {
  Call call("allgather_coalesced");
  Tensors in = call.host(inputs);
  TensorLists out = call.host(outputs, false);
  return issue(call, c10d::OpType::ALLGATHER_COALESCED, flatten(outputs), [out, in, opts](c10d::Backend& b) mutable {
    b.allgather_coalesced(out, in, opts)->wait();
    return c10::intrusive_ptr<c10d::Work>();
  });
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::allgather_into_tensor_coalesced(Tensors& outputs, Tensors& inputs,
                                                                              const c10d::AllgatherOptions& opts) {
  Call call("allgather_into_tensor_coalesced");
  Tensors in = call.host(inputs);
  Tensors out = call.host(outputs, false);
  return issue(call, c10d::OpType::COALESCED, outputs, [out, in, opts](c10d::Backend& b) mutable {
    b.allgather_into_tensor_coalesced(out, in, opts)->wait();
    return c10::intrusive_ptr<c10d::Work>();
  });
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::gather(TensorLists& outputs, Tensors& inputs,
                                                     const c10d::GatherOptions& opts) {
  Call call("gather");
  Tensors in = call.host(inputs);
  TensorLists out = call.host(outputs, false);
  return issue(call, c10d::OpType::GATHER, flatten(outputs), [out, in, opts](c10d::Backend& b) mutable {
    b.gather(out, in, opts)->wait();
    return c10::intrusive_ptr<c10d::Work>();
  });
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::scatter(Tensors& outputs, TensorLists& inputs,
                                                      const c10d::ScatterOptions& opts) {
  Call call("scatter");
  TensorLists in = call.host(inputs);
  Tensors out = call.host(outputs, false);
  return issue(call, c10d::OpType::SCATTER, outputs, [out, in, opts](c10d::Backend& b) mutable {
    b.scatter(out, in, opts)->wait();
    return c10::intrusive_ptr<c10d::Work>();
  });
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::reduce_scatter(Tensors& outputs, TensorLists& inputs,
                                                             const c10d::ReduceScatterOptions& opts) {
  Call call("reduce_scatter");
  TORCH_CHECK(inputs.size() == 1 && outputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(),
              "neuron process group: reduce_scatter takes one output tensor and one list of ", getSize(),
              " inputs (got ", outputs.size(), " and ", inputs.empty() ? 0 : inputs[0].size(), ")");
  for (const auto& i : inputs[0]) {
    check_same_dtype(call.op(), i, outputs[0]);
    check_numel(call.op(), "an input tensor", i.numel(), outputs[0].numel());
  }
  TensorLists in = call.host(inputs);
  Tensors out = call.host(outputs, false);
  c10d::ReduceScatterOptions o = opts;
  o.reduceOp = transport_reduce_op(opts.reduceOp, call.op());
  const bool average = is_average(opts.reduceOp);
  const int size = getSize();
  return issue(call, c10d::OpType::REDUCE_SCATTER, outputs, [out, in, o, average, size](c10d::Backend& b) mutable {
    b.reduce_scatter(out, in, o)->wait();
    if (average)
      for (auto& t : out) divide_for_average(t, size);
    return c10::intrusive_ptr<c10d::Work>();
  });
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                   const c10d::ReduceScatterOptions& opts) {
  Call call("reduce_scatter_tensor");
  check_same_dtype(call.op(), input, output);
  check_numel(call.op(), "the input", input.numel(), output.numel() * getSize());
  at::Tensor in = call.host(input);
  at::Tensor out = call.host(output, false);
  c10d::ReduceScatterOptions o = opts;
  o.reduceOp = transport_reduce_op(opts.reduceOp, call.op());
  const bool average = is_average(opts.reduceOp);
  const int size = getSize();
  return issue(call, c10d::OpType::_REDUCE_SCATTER_BASE, {output}, [out, in, o, average, size](c10d::Backend& b) mutable {
    b._reduce_scatter_base(out, in, o)->wait();
    if (average) divide_for_average(out, size);
    return c10::intrusive_ptr<c10d::Work>();
  });
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::reduce_scatter_tensor_coalesced(
    Tensors& outputs, Tensors& inputs, const c10d::ReduceScatterOptions& opts) {
  Call call("reduce_scatter_tensor_coalesced");
  Tensors in = call.host(inputs);
  Tensors out = call.host(outputs, false);
  c10d::ReduceScatterOptions o = opts;
  o.reduceOp = transport_reduce_op(opts.reduceOp, call.op());
  const bool average = is_average(opts.reduceOp);
  const int size = getSize();
  return issue(call, c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED, outputs,
               [out, in, o, average, size](c10d::Backend& b) mutable {
                 b.reduce_scatter_tensor_coalesced(out, in, o)->wait();
                 if (average)
                   for (auto& t : out) divide_for_average(t, size);
                 return c10::intrusive_ptr<c10d::Work>();
               });
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                            std::vector<int64_t>& output_splits,
                                                            std::vector<int64_t>& input_splits,
                                                            const c10d::AllToAllOptions& opts) {
  Call call("alltoall_base");
  check_same_dtype(call.op(), input, output);
  auto check_splits = [&](const char* what, const at::Tensor& t, const std::vector<int64_t>& splits) {
    if (splits.empty()) {
      TORCH_CHECK(t.dim() > 0 && t.size(0) % getSize() == 0, "neuron process group: alltoall_base: the ", what,
                  "'s first dimension (", t.dim() > 0 ? t.size(0) : 0, ") must divide by the group size ",
                  getSize(), " when no split sizes are given");
      return;
    }
    TORCH_CHECK(static_cast<int>(splits.size()) == getSize(), "neuron process group: alltoall_base got ",
                splits.size(), " ", what, " split sizes for a group of ", getSize());
    int64_t rows = 0;
    for (int64_t n : splits) rows += n;
    TORCH_CHECK(t.dim() > 0 && rows == t.size(0), "neuron process group: alltoall_base: the ", what,
                " split sizes add up to ", rows, " rows, the ", what, " has ", t.dim() > 0 ? t.size(0) : 0);
  };
  check_splits("input", input, input_splits);
  check_splits("output", output, output_splits);
  at::Tensor in = call.host(input);
  at::Tensor out = call.host(output, false);
  return issue(call, c10d::OpType::ALLTOALL_BASE, {output},
               [out, in, output_splits, input_splits, opts](c10d::Backend& b) mutable {
                 b.alltoall_base(out, in, output_splits, input_splits, opts)->wait();
                 return c10::intrusive_ptr<c10d::Work>();
               });
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::alltoall(Tensors& outputs, Tensors& inputs,
                                                       const c10d::AllToAllOptions& opts) {
  Call call("alltoall");
  Tensors in = call.host(inputs);
  Tensors out = call.host(outputs, false);
  return issue(call, c10d::OpType::ALLTOALL, outputs, [out, in, opts](c10d::Backend& b) mutable {
    b.alltoall(out, in, opts)->wait();
    return c10::intrusive_ptr<c10d::Work>();
  });
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::send(Tensors& tensors, int dst, int tag) {
  Call call("send");
  Tensors host = call.host(tensors);
  return issue(
      call, c10d::OpType::SEND, {},
      [host, dst, tag](c10d::Backend& b) mutable { return b.send(host, dst, tag); }, tensors, /*peer=*/true);
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::recv(Tensors& tensors, int src, int tag) {
  Call call("recv");
  Tensors host = call.host(tensors);
  return issue(
      call, c10d::OpType::RECV, tensors,
      [host, src, tag](c10d::Backend& b) mutable { return b.recv(host, src, tag); }, tensors, /*peer=*/true);
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::barrier(const c10d::BarrierOptions& opts) {
  Call call("barrier");
  if (opts.device && opts.device->type() == c10::DeviceType::PrivateUse1 && opts.device->has_index())
    call.set_core(opts.device->index());
  c10d::BarrierOptions o = opts;
  o.device = std::nullopt;  // the transport's own (host) barrier
  return issue(
      call, c10d::OpType::BARRIER, {},
      [o](c10d::Backend& b) mutable {
        b.barrier(o)->wait();
        return c10::intrusive_ptr<c10d::Work>();
      },
      {}, /*peer=*/false, /*blocks_host=*/true);
}

}  // namespace neuron::distributed
