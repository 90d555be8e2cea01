// Feeds the op stream to each stream's segmenter and closes segments (the cut), handing
// them to the trace cache, the trace and the adaptive controller.
#include "engine/recording.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>

#include "backend/op_work.h"
#include "backend/runtime.h"
#include "engine/adaptive_registry.h"
#include "engine/compiled_region.h"
#include "engine/engine.h"
#include "engine/stream_state.h"
#include "engine/trace_events.h"
#include "fusion/policy.h"
#include "trace/segmenter.h"

namespace neuron::engine {

namespace {

std::atomic<uint64_t> g_seq{0};

uint64_t observe_segment(const trace::Segment& s, c10::DeviceIndex core, int64_t stream) {
  const uint64_t now = trace::Recorder::instance().now_ns();
  uint64_t count = 0;
  auto lookup = trace_cache().observe(s, now, &count);
  if (!trace::recording()) return count;
  emit_segment_cut(s, lookup, count, core, stream, now);
  return count;
}

// Closes the open segment of one stream (the caller holds its mutex).
void flush_locked(StreamState& ss, trace::CutReason reason, c10::DeviceIndex core,
                  int64_t stream) {
  if (ss.segmenter.open_length() == 0) {
    if (trace::recording()) emit_replay_cut(core, stream, reason, nullptr, {});
    ss.outputs.clear();
    ss.plan.clear();
    ss.clear_pins();
    ss.identities.clear();
    return;
  }
  // An output is alive if the program still holds it, or holds a view of its storage.
  std::vector<bool>& alive = ss.cut_alive;
  alive.clear();
  alive.reserve(ss.outputs.size());
  std::vector<uint64_t>& open_outputs = ss.cut_outputs;
  ss.segmenter.open_outputs_into(open_outputs);
  for (size_t i = 0; i < ss.outputs.size(); ++i) {
    bool viewed = i < open_outputs.size() &&
                  std::find(ss.viewed.begin(), ss.viewed.end(), open_outputs[i]) != ss.viewed.end();
    alive.push_back(viewed || ss.outputs[i].use_count() > 0);
  }
  ss.viewed.clear();
  trace::Segment* s = &ss.cut_segment;
  const bool closed = ss.segmenter.flush_into(reason, alive, *s);
  ss.outputs.clear();
  if (!closed) {
    ss.clear_pins();
    ss.identities.clear();
    return;
  }
  const uint64_t count = observe_segment(*s, core, stream);
  const bool partial = std::exchange(ss.partial, false);
  if (trace::recording()) emit_replay_cut(core, stream, reason, &*s, alive);
  // Liveness of each op's outputs, for the planner.
  size_t k = 0;
  for (auto& op : ss.plan) {
    op.alive.assign(op.outputs.size(), true);
    for (size_t o = 0; o < op.outputs.size(); ++o, ++k) op.alive[o] = k < alive.size() ? alive[k] : true;
  }
  adaptive_cut(ss, *s, count, core, stream, partial);
  // Only now, with the held ops queued: a storage freed here is reused after they ran.
  ss.clear_pins();
  ss.identities.clear();
}

// A settled stretch begins: the open segment's ops are dropped from the record (held ones
// queued per op first) and the segmenter starts afresh, so nothing of before the stretch
// joins a segment after it.
void begin_stretch_locked(StreamState& ss, c10::DeviceIndex core, int64_t stream) {
  if (ss.holding || !ss.window.empty()) enqueue_per_op(ss, core, stream);
  ss.candidates.clear();
  ss.trial_span.reset();
  ss.released = 0;
  ss.released_extern = 0;
  ss.outputs.clear();
  ss.plan.clear();
  ss.viewed.clear();
  ss.clear_pins();
  ss.identities.clear();
  ss.segmenter = trace::Segmenter(current_segment_policy());
  ss.partial = true;
  ss.stretch_open = true;
}

}  // namespace

void StreamState::unpin_before(uint32_t ops) {
  if (ops == 0 || pin_ends.empty()) return;
  const uint32_t end = pin_ends[std::min<size_t>(ops, pin_ends.size()) - 1];
  for (; pin_dropped < end; ++pin_dropped) {
    c10::Storage& pin = pinned[pin_dropped];
    identities.emplace_back(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(pin.unsafeGetStorageImpl()));
    pin = c10::Storage();
  }
}

void StreamState::clear_pins() {
  pinned.clear();
  pin_ends.clear();
  pin_dropped = 0;
}

bool settled_op(c10::DeviceIndex core, int64_t stream) {
  StreamState& ss = stream_state(core, stream);
  if (ss.settled_ops.load(std::memory_order_relaxed) == 0) return false;
  std::lock_guard lock(ss.mutex);
  if (ss.settled_ops.load(std::memory_order_relaxed) == 0) return false;
  if (trace::recording() || any_compiled_region() || mode() != Mode::kAdaptive) {
    ss.settled_ops = 0;  // a trace or a compiled region needs every op recorded
    ss.stretch_open = false;
    if (std::exchange(ss.guard_stretch, false)) ss.stream_guard.abort();
    return false;
  }
  if (!ss.stretch_open) begin_stretch_locked(ss, core, stream);
  if (ss.settled_ops.fetch_sub(1, std::memory_order_relaxed) == 1) {
    // The stretch's last op: a stretch the stream trial asked for may be followed by
    // another (the next of its pairs, or the period after an unrecorded verdict).
    const uint64_t next = ss.guard_stretch ? stream_trial_unrecorded_done(ss, core) : 0;
    if (next > 0) {
      ss.settled_ops = static_cast<uint32_t>(std::min<uint64_t>(next, UINT32_MAX));
    } else {
      ss.stretch_open = false;
      ss.guard_stretch = false;
    }
  }
  ++g_ops_per_op;
  ++g_settled_ops;
  return true;
}

trace::TraceCache& trace_cache() {
  static auto* cache = new trace::TraceCache(fusion::Policy{}.hot_threshold);
  return *cache;
}

void flush_windows(c10::DeviceIndex core) { flush_windows(core, trace::CutReason::kSync); }

void flush_windows(c10::DeviceIndex core, trace::CutReason reason) {
  if (!observing() && !any_window_open()) return;
  for (int64_t s = 0; s < backend::kMaxStreamsPerCore; ++s) {
    StreamState* st = find_stream_state(core, s);
    if (st == nullptr) continue;
    std::lock_guard lock(st->mutex);
    flush_locked(*st, reason, core, s);
  }
}

void note_view(const at::Tensor& base) {
  if (!observing() || !base.defined() || !base.has_storage()) return;
  const c10::DeviceIndex core = base.device().index();
  StreamState* st = find_stream_state(core, current_stream_id(core));
  if (st == nullptr) return;
  if (st->settled_ops.load(std::memory_order_relaxed) > 0) return;  // nothing is recorded
  std::lock_guard lock(st->mutex);
  const uint64_t id = reinterpret_cast<uint64_t>(base.storage().unsafeGetStorageImpl());
  if (std::find(st->viewed.begin(), st->viewed.end(), id) == st->viewed.end()) st->viewed.push_back(id);
}

void flush_all_windows() {
  if (!backend::initialized()) return;
  for (int core = 0; core < device_count(); ++core) flush_windows(static_cast<c10::DeviceIndex>(core));
}

bool observing() {
  return trace::recording() || mode() == Mode::kAdaptive || any_compiled_region();
}

uint64_t next_seq() { return g_seq.fetch_add(1, std::memory_order_relaxed) + 1; }

void note_dispatch(std::unique_ptr<backend::OpWork>& owned, const OpInfo& info,
                   c10::DeviceIndex core, int64_t stream, uint64_t start_ns,
                   const std::vector<at::Tensor>& fresh_outputs) {
  backend::OpWork& work = *owned;  // plan_op_of may normalise a dim argument
  trace::SegmentOp op;
  op.op = info.id;
  op.kind = info.kind;
  op.signature = active_policy_lifts() ? work.record.lifted_hash() : work.record.hash();
  op.seq = work.seq;
  op.whole_run = info.foreach;
  op.inputs.reserve(work.record.tensors.size());
  for (const auto& m : work.record.tensors) op.inputs.push_back(m.defined && m.device >= 0 ? m.storage : 0);
  op.outputs.reserve(fresh_outputs.size());
  for (const auto& t : fresh_outputs)
    op.outputs.push_back(t.defined() ? reinterpret_cast<uint64_t>(t.storage().unsafeGetStorageImpl()) : 0);
  StreamState& ss = stream_state(core, stream);
  const bool adaptive = mode() == Mode::kAdaptive || any_compiled_region();
  const bool recording = trace::recording();
  thread_local std::vector<uint32_t> links;
  {
    std::lock_guard lock(ss.mutex);
    // A repeat of the open segment's start (a loop iteration): close it before this op.
    if (ss.segmenter.cut_before(op)) flush_locked(ss, trace::CutReason::kContent, core, stream);
    if (recording) link_dataflow(core, stream, op, links);
    // The caller still holds the inputs here (the op may be queued and run below).
    thread_local std::vector<c10::StorageImpl*> touched;
    touched.clear();
    for (const auto& src : work.inputs)
      if (src.storage) touched.push_back(reinterpret_cast<c10::StorageImpl*>(src.storage.id));
    for (const auto& t : fresh_outputs)
      if (t.defined()) touched.push_back(t.storage().unsafeGetStorageImpl());
    if (adaptive) {
      fusion::PlanOp plan_op = plan_op_of(work, info);
      plan_op.outputs.assign(op.outputs.begin(), op.outputs.end());
      for (auto& v : plan_op.outputs) if (v == 0) v = -1;
      adaptive_take(ss, std::move(owned), std::move(plan_op), op.signature, core, stream);
    }
    // Storages of the open segment keep their identity until its cut (no StorageImpl is
    // freed and its address reused, so dataflow edges stay exact); while ops are held
    // their memory stays too (held ops read it once queued). Ops queued at once let
    // their memory go as in eager mode: a weak reference keeps only the identity.
    for (c10::StorageImpl* impl : touched) {
      auto strong = c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(impl);
      if (ss.holding) ss.pinned.emplace_back(std::move(strong));
      else ss.identities.emplace_back(strong);
    }
    if (ss.holding) {
      // Pins by segment position (holding starts at the first op; positions before it,
      // if any, pinned nothing).
      ss.pin_ends.resize(ss.segmenter.open_length(), ss.pin_ends.empty() ? 0 : ss.pin_ends.back());
      ss.pin_ends.push_back(static_cast<uint32_t>(ss.pinned.size()));
    }
    for (const auto& t : fresh_outputs)
      ss.outputs.emplace_back(t.defined() ? c10::weak_intrusive_ptr<c10::TensorImpl>(
                                                t.getIntrusivePtr())
                                          : c10::weak_intrusive_ptr<c10::TensorImpl>(
                                                c10::intrusive_ptr<c10::TensorImpl>()));
    // Liveness is read at the cut: outputs the program already dropped are dead.
    if (auto reason = ss.segmenter.add(op))
      flush_locked(ss, *reason, core, stream);
    else if (adaptive)
      adaptive_after_add(ss, core, stream);
    if (adaptive && !recording && mode() == Mode::kAdaptive && !any_compiled_region())
      if (const uint64_t unrecorded = stream_trial_recorded_op(ss, core); unrecorded > 0) {
        ss.settled_ops = static_cast<uint32_t>(std::min<uint64_t>(unrecorded, UINT32_MAX));
        ss.guard_stretch = true;
      }
  }
  if (trace::recording()) emit_op_dispatch(work, info, op, core, stream, start_ns, links);
}

void note_synchronous_op(const OpInfo& info) {
  if (!observing() && !any_window_open()) return;
  // A barrier: segments never contain it.
  const c10::DeviceIndex core = current_device();
  // Everything held on this core goes first: the op runs right now on the host.
  for (int64_t s = 0; s < backend::kMaxStreamsPerCore; ++s) {
    StreamState* st = find_stream_state(core, s);
    if (st == nullptr) continue;
    std::lock_guard lock(st->mutex);
    flush_locked(*st, trace::CutReason::kBarrier, core, s);
  }
  if (trace::recording()) emit_synchronous_op(info, core);
}

}  // namespace neuron::engine
