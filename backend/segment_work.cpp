#include "backend/segment_work.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <unordered_map>

#include "trace/log.h"
#include "trace/small_vec.h"
#include "trace/recorder.h"

namespace neuron::backend {
namespace {

// A 1-D view of elements [lo, hi) of a contiguous device tensor.
at::Tensor tile_of(const DeviceBuffer& storage, const trace::TensorMeta& m, int64_t lo, int64_t hi) {
  trace::TensorMeta t = m;
  t.ndim = 1;
  t.sizes[0] = hi - lo;
  t.strides[0] = 1;
  t.storage_offset = m.storage_offset + lo;
  return cpu_alias(storage, t);
}

uint64_t storage_id(const DeviceBuffer& s) { return s.id; }

}  // namespace

std::atomic<int> g_injected_failures{0};

void inject_tile_group_failures(int n) { g_injected_failures.store(n); }

namespace {
void maybe_inject_failure() {
  if (g_injected_failures.load() > 0 && g_injected_failures.fetch_sub(1) > 0)
    throw std::runtime_error("injected tile-group failure");
}
}  // namespace

void SegmentWork::run_group(const fusion::Step& step) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  const int64_t numel = step.numel;
  const int64_t row = step.row;  // 0: plain pointwise group
  // Distinct full-size arrays the tiles walk (row-broadcast weights and per-row values
  // are small; a tensor read by several ops is one array).
  int64_t widest = 1;
  trace::SmallVec<uint64_t, 32> arrays;
  auto note = [&](uint64_t id, const trace::TensorMeta& m) {
    if (m.numel() != numel) return;
    widest = std::max<int64_t>(widest, c10::elementSize(static_cast<c10::ScalarType>(m.dtype)));
    if (std::find(arrays.begin(), arrays.end(), id) == arrays.end()) arrays.push_back(id);
  };
  for (uint32_t k = step.first; k < step.first + step.count; ++k) {
    const OpWork& op = *ops[k];
    for (size_t i = 0; i < op.record.tensors.size(); ++i)
      if (op.inputs[i].storage) note(storage_id(op.inputs[i].storage), op.record.tensors[i]);
    for (size_t o = 0; o < op.output_metas.size(); ++o)
      note(storage_id(op.output_storages[o]), op.output_metas[o]);
  }
  const int64_t operands = std::max<int64_t>(1, static_cast<int64_t>(arrays.size()));
  int64_t tile = fusion::tile_elements(operands, widest, program->tile_bytes);
  // Per-row values (layer norm's mean and rstd, a keepdim row sum): a last size of 1 and
  // one element per row (a row-broadcast operand of C elements can have the same count
  // when there are C rows).
  auto per_row = [&](const trace::TensorMeta& m) {
    return row > 0 && m.ndim > 0 && m.sizes[m.ndim - 1] == 1 && m.numel() * row == numel;
  };
  if (row > 0) {
    // Whole rows, and a multiple of 64 elements so vector tails fall where ATen's do.
    // Per-row values ([rows, 1]: a row sum, layer norm's statistics) are arrays of their
    // own: ops on them (sigmoid of a row sum) take ATen's vector or scalar path by an
    // element's position in the tile, so tiles also hold a multiple of 64 rows (ATen's
    // loops run two vectors at a time, 64 bytes at most per lane group: 16 floats with
    // AVX-512, up to 64 elements for 16-bit types) and the last tile ends where the
    // whole tensor does. Before, robust.py seed 40417 cell 28 (sum, then
    // y * sigmoid(sum), 32768 rows of 64) differed from CPU in 51 of 2M elements.
    bool per_row_values = false;
    for (uint32_t k = step.first; k < step.first + step.count && !per_row_values; ++k) {
      const OpWork& op = *ops[k];
      for (size_t i = 0; i < op.record.tensors.size(); ++i)
        per_row_values |= op.inputs[i].storage && per_row(op.record.tensors[i]);
      for (const auto& m : op.output_metas) per_row_values |= per_row(m);
    }
    const int64_t unit = per_row_values ? row * 64 : std::lcm<int64_t>(row, 64);
    tile = std::max<int64_t>(unit, tile / unit * unit);
    // At least 2 rows per tile, the last one included: with a single output element
    // ATen's var switches to its whole-tensor algorithm (other bits than per row).
    const int64_t rows = numel / row;
    while (tile < numel && (tile / row < 2 || rows % (tile / row) == 1)) tile += unit;
  }
  const int64_t tiles = (numel + tile - 1) / tile;
  set_item_threads(true, numel * static_cast<int64_t>(operands));  // tiles never depend on the thread count
  // Tiles are independent (pointwise and row-local ops): threads take whole tiles, and
  // the kernels inside run single-threaded (ATen does not nest parallel regions).
  at::parallel_for(0, tiles, 1, [&](int64_t first_tile, int64_t end_tile) {
    // Scratch buffers for intermediates that never reach device memory, by storage.
    std::unordered_map<uint64_t, at::Tensor> scratch;
    for (uint32_t k = 0; k < step.count; ++k) {
      const OpWork& op = *ops[step.first + k];
      for (size_t o = 0; o < op.output_metas.size(); ++o)
        if (step.scratch[k][o]) {
          const int64_t per_tile = op.output_metas[o].numel() == numel ? tile : tile / std::max<int64_t>(row, 1);
          scratch[storage_id(op.output_storages[o])] = at::empty(
              {per_tile}, at::TensorOptions().dtype(static_cast<c10::ScalarType>(op.output_metas[o].dtype)));
        }
    }
    // The tile [lo, hi) of a tensor: full-size tensors are cut (as rows when the group
    // has rows), per-row values (layer norm's mean and rstd) by rows, anything else
    // (0-dim scalars, row-broadcast operands) is passed whole.
    auto view = [&](const DeviceBuffer& storage, const trace::TensorMeta& m, int64_t lo, int64_t hi) -> at::Tensor {
      if (m.ndim == 0) return cpu_alias(storage, m);
      const int64_t n = m.numel();
      auto s = scratch.find(storage_id(storage));
      auto shaped = [&](at::Tensor flat, int64_t rows, int64_t cols) {
        return cols > 0 ? flat.view({rows, cols}) : flat;
      };
      if (n == numel) {
        at::Tensor flat = s != scratch.end() ? s->second.narrow(0, 0, hi - lo) : tile_of(storage, m, lo, hi);
        return row > 0 ? shaped(flat, (hi - lo) / row, row) : flat;
      }
      if (per_row(m)) {
        const int64_t a = lo / row, b = hi / row;
        at::Tensor flat = s != scratch.end() ? s->second.narrow(0, 0, b - a) : tile_of(storage, m, a, b);
        return shaped(flat, b - a, 1);
      }
      return cpu_alias(storage, m);
    };
    torch::jit::Stack stack;
    for (int64_t t = first_tile; t < end_tile; ++t) {
      const int64_t lo = t * tile, hi = std::min(numel, lo + tile);
      for (uint32_t k = step.first; k < step.first + step.count; ++k) {
        OpWork& op = *ops[k];
        auto input = [&](uint32_t index) -> at::Tensor {
          const trace::TensorMeta& m = op.record.tensors[index];
          const TensorSource& src = op.inputs[index];
          if (!src.storage) return src.host;  // host scalar, or an absent optional
          return view(src.storage, m, lo, hi);
        };
        stack.clear();
        op.push_arguments(stack, input, [&](size_t i) -> const c10::IValue& { return op.values[i]; });
        for (size_t o = 0; o < op.output_metas.size(); ++o)
          stack.emplace_back(view(op.output_storages[o], op.output_metas[o], lo, hi));
        op.out_op->redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &stack);
      }
    }
  });
}

void SegmentWork::run_foreach(const fusion::Step& step) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  // Tensor by tensor: each tensor's data stays in cache across the group's ops. The
  // kernels are elementwise (their bits do not depend on the thread count) and run on
  // one thread: measured on the AdamW step (100 x 128x128, 2 cores), 2 threads per
  // small kernel cost 21 ms per step, whole tensors split across 2 threads 16.4-16.9 ms,
  // one thread 13.2-14.1 ms (the dispatching thread needs the other core). Sharing the
  // tensors out among 2 threads once the host waits gained nothing either (8.2-9.1 ms
  // per step both ways, 2026-12-01): each element op costs ~10 us of dispatch and
  // TensorIterator set-up for 16K elements.
  // Traced, each op's share of the group's time is an OpExecute nested in the segment:
  // offline replay reads warm per-op costs from it (a fused key has no others).
  const bool traced = trace::recording() && ops[step.first]->seq != 0;
  const uint64_t start = traced ? trace::Recorder::instance().now_ns() : 0;
  std::vector<uint64_t> op_ns(traced ? step.count : 0, 0);
  set_item_threads_to(1);
  torch::jit::Stack stack;
  for (int64_t i = 0; i < step.list; ++i)
    for (uint32_t k = step.first; k < step.first + step.count; ++k) {
      if (!traced) {
        ops[k]->run_element(static_cast<uint32_t>(i), stack);
        continue;
      }
      const auto t0 = std::chrono::steady_clock::now();
      ops[k]->run_element(static_cast<uint32_t>(i), stack);
      op_ns[k - step.first] += static_cast<uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
    }
  if (!traced || !trace::recording()) return;
  // Each op's share of the group's wall time, laid end to end inside it.
  auto& rec = trace::Recorder::instance();
  const uint64_t wall = rec.now_ns() - start;
  const double sum = static_cast<double>(std::accumulate(op_ns.begin(), op_ns.end(), uint64_t{0}));
  uint64_t at = start;
  for (uint32_t k = 0; k < step.count; ++k) {
    const uint64_t ns = sum > 0 ? static_cast<uint64_t>(static_cast<double>(wall) * static_cast<double>(op_ns[k]) / sum) : 0;
    emit_op_execute(*ops[step.first + k], at, ns);
    at += ns;
  }
}

void SegmentWork::run() {
  const bool traced = seq != 0 && trace::recording();
  const uint64_t start = traced ? trace::Recorder::instance().now_ns() : 0;
  if (traced) trace::Recorder::instance().thread_id("worker");
  for (size_t i = 0; i < program->steps.size(); ++i) {
    const fusion::Step& step = program->steps[i];
    if (step.first >= ops.size() || !ops[step.first]) continue;  // queued before (or after) this item
    if (step.kind == fusion::Step::kExtern) {
      ops[step.first]->run();
      continue;
    }
    if (step.kind == fusion::Step::kForeachGroup) {
      try {
        maybe_inject_failure();
      } catch (const std::exception&) {
        // Before anything ran: the ops run one by one (as whole-list ops).
        if (failures) failures->fetch_add(1);
        for (uint32_t k = step.first; k < step.first + step.count; ++k) ops[k]->run();
        continue;
      }
      // A kernel error here is the op's own error (as per op, it surfaces at the next
      // sync); rerunning would apply in-place updates twice.
      NativeGroup* native = i < natives.size() ? natives[i].get() : nullptr;
      if (native != nullptr) {
        native->before_first_run(ops, step);
        if (native->try_run(ops, step)) continue;
      }
      const std::unique_ptr<ForeachSnapshot> snapshot = native ? native->before_tier1(ops, step) : nullptr;
      const auto t0 = std::chrono::steady_clock::now();
      run_foreach(step);
      if (native == nullptr) continue;
      const auto tier1_ns = static_cast<uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
      try {
        native->after_tier1(ops, step, tier1_ns, snapshot.get());  // tier 2 bookkeeping only
      } catch (const std::exception&) {
      }
      continue;
    }
    NativeGroup* native = i < natives.size() ? natives[i].get() : nullptr;
    uint64_t tier1_ns = 0;
    bool whole = false;
    try {
      maybe_inject_failure();
      if (native != nullptr) {
        native->before_first_run(ops, step);
        if (native->try_run(ops, step)) continue;
      }
      const auto t0 = std::chrono::steady_clock::now();
      whole = native != nullptr && native->run_whole_next();
      if (whole) {
        // Each op on its whole tensors (intermediates in scratch are written too).
        for (uint32_t k = step.first; k < step.first + step.count; ++k) ops[k]->run();
      } else {
        run_group(step);
      }
      tier1_ns = static_cast<uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
    } catch (const std::exception& e) {
      // The group's ops are functional: rerunning them per op from their inputs gives
      // the per-op results; the controller blacklists the key.
      if (failures) failures->fetch_add(1);
      if (trace::log_enabled(trace::LogLevel::kWarn))
        trace::log(trace::LogLevel::kWarn, "a fused group of segment " + std::to_string(key) +
                                               " failed (its ops rerun per op): " + e.what());
      for (uint32_t k = step.first; k < step.first + step.count; ++k) ops[k]->run();
      continue;
    }
    if (native == nullptr) continue;
    try {
      native->note_tier1(whole, tier1_ns);
      native->after_tier1(ops, step, tier1_ns);  // results are written: tier 2 bookkeeping only
    } catch (const std::exception&) {
    }
  }
  if (traced && trace::recording()) {
    auto& rec = trace::Recorder::instance();
    trace::Event e;
    e.time_ns = start;
    e.duration_ns = rec.now_ns() - start;
    e.kind = static_cast<uint8_t>(trace::EventKind::kSegmentExecute);
    e.seq = seq;
    e.value = key;
    e.aux = static_cast<uint64_t>(std::count_if(ops.begin(), ops.end(), [](const auto& o) { return o != nullptr; }));
    e.core = core;
    e.stream = stream;
    rec.emit(e);
  }
}

void SegmentWork::finish(std::unique_ptr<WorkItem> self) {
  for (auto& op : ops) OpWork::recycle(std::move(op));
  self.reset();
}

std::string SegmentWork::describe() const {
  return "fused segment of " + std::to_string(ops.size()) + " ops";
}

}  // namespace neuron::backend
