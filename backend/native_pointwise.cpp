// Tier 2 for tile groups (pointwise and row groups): runs of the kernel over tiles, and its
// side-by-side trial against tier 1. Their kernel spec: native_tile_spec.cpp.
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "backend/native_group.h"
#include "backend/native_group_detail.h"
#include "trace/op_registry.h"

namespace neuron::backend {
using namespace detail;

void NativeGroup::run_kernel(const std::vector<std::unique_ptr<OpWork>>& ops,
                             const fusion::Step& step, const std::vector<char*>* output_override) {
  fusion::NativeKernelFn fn = fn_.load();
  std::vector<char*> ptrs(binding_.pointers.size());
  size_t next_output = 0;
  for (size_t i = 0; i < ptrs.size(); ++i) {
    const auto& b = binding_.pointers[i];
    const OpWork& op = *ops[step.first + b.op];
    if (b.output)
      ptrs[i] = output_override ? (*output_override)[next_output++]
                                : data_of(op.output_storages[b.index], op.output_metas[b.index]);
    else
      ptrs[i] = data_of(op.inputs[b.index].storage, op.record.tensors[b.index]);
  }
  std::vector<double> scalars(binding_.scalars.size());
  for (size_t i = 0; i < scalars.size(); ++i) {
    const auto& b = binding_.scalars[i];
    const OpWork& op = *ops[step.first + b.op];
    scalars[i] = b.from_tensor ? op.inputs[b.index].host.item<double>() : scalar_value(op.values[b.index]);
  }
  const int64_t numel = step.numel;
  // Tiles only spread the work over threads; a multiple of 64 elements, so the scalar
  // tail falls where tier 1 (and ATen) put it: at the end of the tensor.
  // Row kernels run whole rows.
  const int64_t tile = step.row > 0 ? std::max<int64_t>(1, policy_.native_tile(numel) / step.row) * step.row
                                    : policy_.native_tile(numel);
  const int64_t tiles = (numel + tile - 1) / tile;
  // Tiles never depend on the thread count. Small groups stay on this thread (waking a
  // helper costs more than they take); larger ones spread once the host waits.
  if (numel * static_cast<int64_t>(ptrs.size()) < static_cast<int64_t>(policy_.spread_elements)) {
    set_item_threads_to(1);
    for (int64_t t = 0; t < tiles; ++t) fn(t * tile, std::min(numel, (t + 1) * tile), ptrs.data(), scalars.data());
    return;
  }
  run_free_units(tiles, [&](int64_t t) { fn(t * tile, std::min(numel, (t + 1) * tile), ptrs.data(), scalars.data()); });
}

void NativeGroup::trial(const std::vector<std::unique_ptr<OpWork>>& ops, const fusion::Step& step,
                        uint64_t tier1_ns) {
  // Tier 1 already wrote the results; tier 2 writes into scratch copies, then both are
  // compared element by element (NaN equals NaN; every other value bit for bit).
  const size_t elem = type_ == fusion::ElemType::kFloat32 ? 4 : 8;
  std::vector<at::Tensor> scratch;
  std::vector<char*> outs;
  for (const auto& b : binding_.pointers)
    if (b.output) {
      const int64_t numel = ops[step.first + b.op]->output_metas[b.index].numel();  // a row op's stats: one per row
      scratch.push_back(at::empty({numel}, at::TensorOptions().dtype(
                                               type_ == fusion::ElemType::kFloat32 ? c10::kFloat : c10::kDouble)));
      outs.push_back(static_cast<char*>(scratch.back().data_ptr()));
      // Touched before the clock starts: tier 1 writes into blocks the device allocator
      // reuses, so page faults on fresh scratch memory (a 2 MB output: more than the
      // kernel itself) would be charged to tier 2 alone.
      std::memset(outs.back(), 0, static_cast<size_t>(numel) * elem);
    }
  const uint64_t start = steady_ns();
  run_kernel(ops, step, &outs);
  const uint64_t tier2_ns = steady_ns() - start;
  bool equal = true;
  size_t o = 0;
  for (const auto& b : binding_.pointers) {
    if (!b.output) continue;
    const OpWork& op = *ops[step.first + b.op];
    const char* want = data_of(op.output_storages[b.index], op.output_metas[b.index]);
    const char* got = outs[o++];
    const int64_t numel = op.output_metas[b.index].numel();
    for (int64_t i = 0; i < numel && equal; ++i)
      equal = policy_.numerics == fusion::Numerics::kFast
                  ? close_value(want + i * elem, got + i * elem, type_, policy_.fast_rtol, policy_.fast_atol)
                  : same_value(want + i * elem, got + i * elem, type_);
  }
  judge(equal, tier1_ns, tier2_ns);
}

}  // namespace neuron::backend
