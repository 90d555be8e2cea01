#include "engine/trace_events.h"

#include <c10/core/ScalarType.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <memory>
#include <span>

#include "backend/op_work.h"
#include "backend/runtime.h"
#include "fusion/policy.h"
#include "trace/dataflow.h"
#include "trace/op_registry.h"
#include "trace/recorder.h"

namespace neuron::engine {
namespace {

using trace::Event;
using trace::EventKind;
using trace::Recorder;

// What replay needs beyond the cuts, per stream (used under the stream's mutex): slot links,
// the last op seen and the last forced cut written.
struct ReplayRecordState {
  trace::DataflowLinker linker;
  uint64_t session = 0, last_seq = 0, flushed_seq = 0;
};
std::array<std::array<std::unique_ptr<ReplayRecordState>, backend::kMaxStreamsPerCore>, 64> g_replay;
std::atomic<uint64_t> g_replay_session{1};

ReplayRecordState& replay_state(c10::DeviceIndex core, int64_t stream) {
  auto& slot = g_replay.at(static_cast<size_t>(core)).at(static_cast<size_t>(stream));
  if (!slot) slot = std::make_unique<ReplayRecordState>();
  const uint64_t session = g_replay_session.load(std::memory_order_relaxed);
  if (slot->session != session) *slot = ReplayRecordState{{}, session, 0, 0};
  return *slot;
}

// Never throws: an unusual dtype counts as zero bytes (c10::elementSize knows every dtype
// before Undefined: torch declares both from one list).
uint64_t itemsize_of(int8_t dtype) {
  if (dtype < 0 || dtype >= static_cast<int8_t>(c10::ScalarType::Undefined)) return 0;
  return c10::elementSize(static_cast<c10::ScalarType>(dtype));
}

// Bytes the op reads and writes: its tensor inputs and fresh outputs (replay's cost model).
uint64_t bytes_moved(const backend::OpWork& work) {
  uint64_t bytes = 0;
  auto add = [&](const trace::TensorMeta& m) {
    if (m.defined && m.device >= 0) bytes += static_cast<uint64_t>(m.numel()) * itemsize_of(m.dtype);
  };
  for (const auto& m : work.record.tensors) add(m);
  for (const auto& m : work.output_metas) add(m);
  return bytes;
}

uint64_t matmul_flops_of(const backend::OpWork& work, const OpInfo& info) {
  static const std::vector<trace::OpId> ids = [] {
    std::vector<trace::OpId> v;
    for (const auto& name : fusion::matmul_class_ops()) v.push_back(trace::OpRegistry::instance().intern(name));
    return v;
  }();
  if (std::find(ids.begin(), ids.end(), info.id) == ids.end()) return 0;
  return trace::matmul_flops(info.name, work.record.tensors, work.output_metas);
}

}  // namespace

void link_dataflow(c10::DeviceIndex core, int64_t stream, const trace::SegmentOp& op,
                   std::vector<uint32_t>& links) {
  ReplayRecordState& r = replay_state(core, stream);
  r.last_seq = op.seq;
  r.linker.link(op.seq, std::span<const uint64_t>(op.inputs.data(), op.inputs.size()),
                std::span<const uint64_t>(op.outputs.data(), op.outputs.size()), links);
}

void emit_op_dispatch(const backend::OpWork& work, const OpInfo& info, const trace::SegmentOp& op,
                      c10::DeviceIndex core, int64_t stream, uint64_t start_ns,
                      const std::vector<uint32_t>& links) {
  Event e;
  e.time_ns = start_ns;
  e.duration_ns = Recorder::instance().now_ns() - start_ns;
  e.kind = static_cast<uint8_t>(EventKind::kOpDispatch);
  e.seq = op.seq;
  e.op = info.id;
  e.value = op.signature;
  e.aux = bytes_moved(work);
  e.core = static_cast<uint8_t>(core);
  e.stream = static_cast<uint16_t>(stream);
  Recorder::instance().emit(e);
  thread_local std::vector<Event> dataflow;
  dataflow.clear();
  trace::append_dataflow_events(e, links, dataflow);
  if (uint64_t flops = matmul_flops_of(work, info)) {
    Event f = dataflow.front();
    f.flags = trace::kDataflowFlops;
    f.value = flops;
    f.aux = 0;
    dataflow.push_back(f);
  }
  for (const auto& d : dataflow) Recorder::instance().emit(d);
}

void emit_segment_cut(const trace::Segment& s, trace::TraceCache::Lookup lookup, uint64_t count,
                      c10::DeviceIndex core, int64_t stream, uint64_t now) {
  Event cut;
  cut.time_ns = now;
  cut.kind = static_cast<uint8_t>(EventKind::kSegmentCut);
  cut.core = static_cast<uint8_t>(core);
  cut.stream = static_cast<uint16_t>(stream);
  cut.value = s.key;
  cut.aux = s.length;
  cut.seq = s.first_seq;
  cut.flags = static_cast<uint16_t>(s.reason);
  Recorder::instance().emit(cut);
  Event key = cut;
  key.kind = static_cast<uint8_t>(lookup == trace::TraceCache::Lookup::kHit ? EventKind::kKeyHit
                                                                           : EventKind::kKeyMiss);
  key.aux = count;
  key.flags = lookup == trace::TraceCache::Lookup::kCollision ? 1 : 0;
  Recorder::instance().emit(key);
  emit_counters(core, now);
}

// Forced cuts (sync, barrier) do not depend on the policy: replay needs every one, even
// those that found the segment empty. Dead outputs of each cut let it rebuild keys.
void emit_replay_cut(c10::DeviceIndex core, int64_t stream, trace::CutReason reason,
                     const trace::Segment* s, const std::vector<bool>& alive) {
  auto& rec = Recorder::instance();
  Event e;
  e.time_ns = rec.now_ns();
  e.core = static_cast<uint8_t>(core);
  e.stream = static_cast<uint16_t>(stream);
  if (s != nullptr) {
    for (size_t chunk = 0; chunk * 128 < alive.size(); ++chunk) {
      Event d = e;
      d.kind = static_cast<uint8_t>(EventKind::kSegmentLiveness);
      d.seq = s->first_seq;
      d.flags = static_cast<uint16_t>(chunk);
      for (size_t i = chunk * 128; i < std::min(alive.size(), chunk * 128 + 128); ++i)
        if (!alive[i]) (i % 128 < 64 ? d.value : d.aux) |= uint64_t{1} << (i % 64);
      if (d.value | d.aux) rec.emit(d);
    }
  }
  if (reason != trace::CutReason::kSync && reason != trace::CutReason::kBarrier) return;
  ReplayRecordState& r = replay_state(core, stream);
  if (r.last_seq == r.flushed_seq) return;
  e.kind = static_cast<uint8_t>(EventKind::kStreamFlush);
  e.seq = r.flushed_seq = r.last_seq;
  e.flags = static_cast<uint16_t>(reason);
  rec.emit(e);
}

void emit_counters(c10::DeviceIndex core, uint64_t now) {
  if (!trace::recording()) return;
  auto stats = backend::memory(core).stats();
  Event m;
  m.time_ns = now;
  m.kind = static_cast<uint8_t>(EventKind::kMemory);
  m.core = static_cast<uint8_t>(core);
  m.value = static_cast<uint64_t>(stats.allocated_bytes.current);
  m.aux = static_cast<uint64_t>(stats.reserved_bytes.current);
  Recorder::instance().emit(m);
  Event q = m;
  q.kind = static_cast<uint8_t>(EventKind::kQueueDepth);
  q.value = static_cast<uint64_t>(backend::pending_work(core));
  q.aux = 0;
  Recorder::instance().emit(q);
}

void emit_synchronous_op(const OpInfo& info, c10::DeviceIndex core) {
  Event e;
  e.time_ns = Recorder::instance().now_ns();
  e.kind = static_cast<uint8_t>(EventKind::kFallback);
  e.op = info.id;
  e.core = static_cast<uint8_t>(core);
  e.value = Recorder::instance().intern_string(
      info.synchronous_reason.empty() ? "Meta kernel failed for these arguments"
                                      : info.synchronous_reason);
  Recorder::instance().emit(e);
}

void restart_dataflow_links() { g_replay_session.fetch_add(1); }

}  // namespace neuron::engine
