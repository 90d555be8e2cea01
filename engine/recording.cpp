#include "engine/recording.h"

#include <c10/core/ScalarType.h>
#include <torch/version.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <array>
#include <memory>
#include <mutex>
#include <unordered_set>

#include "backend/op_work.h"
#include "backend/runtime.h"
#include "engine/engine.h"
#include "fusion/policy.h"
#include "trace/op_registry.h"
#include "engine/stream_state.h"
#include "trace/dataflow.h"
#include "trace/segmenter.h"

namespace neuron::engine {

bool any_window_open();  // adaptive.cpp
void guard_policy_changed(const fusion::Policy& policy);  // adaptive.cpp

namespace {

using trace::Event;
using trace::EventKind;
using trace::Recorder;

std::atomic<uint64_t> g_seq{0};
std::mutex g_seen_mutex;
std::unordered_set<std::string> g_seen_causes;  // sync causes seen in this recording
std::atomic<std::string (*)()> g_stack_capture{nullptr};

std::mutex g_policy_mutex;
fusion::Policy g_policy;  // guarded by g_policy_mutex

trace::SegmentPolicy segment_policy_of(const fusion::Policy& policy) {
  trace::SegmentPolicy p;
  p.max_length = policy.max_segment_length;
  p.rolling_window = policy.rolling_window;
  p.rolling_mask = (uint64_t{1} << policy.rolling_bits) - 1;
  p.use_rolling_cut = policy.rolling_bits > 0;
  p.keep_runs_whole = policy.foreach_runs_whole;
  if (policy.cut_after_matmul) {
    auto& reg = trace::OpRegistry::instance();
    for (const auto& name : fusion::matmul_class_ops()) p.cut_after.push_back(reg.intern(name));
  }
  return p;
}

trace::SegmentPolicy default_segment_policy() {
  std::lock_guard lock(g_policy_mutex);
  return segment_policy_of(g_policy);
}

std::array<std::array<std::unique_ptr<StreamState>, backend::kMaxStreamsPerCore>, 64> g_states;
std::mutex g_states_mutex;

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

uint64_t observe_segment(const trace::Segment& s, c10::DeviceIndex core, int64_t stream) {
  const uint64_t now = Recorder::instance().now_ns();
  uint64_t count = 0;
  auto lookup = trace_cache().observe(s, now, &count);
  if (!trace::recording()) return count;
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
  return count;
}

// Closes the open segment of one stream (the caller holds its mutex).
void flush_locked(StreamState& ss, trace::CutReason reason, c10::DeviceIndex core,
                  int64_t stream) {
  if (ss.segmenter.open_length() == 0) {
    if (trace::recording()) emit_replay_cut(core, stream, reason, nullptr, {});
    ss.outputs.clear();
    ss.plan.clear();
    ss.pinned.clear();
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
    ss.pinned.clear();
    return;
  }
  const uint64_t count = observe_segment(*s, core, stream);
  if (trace::recording()) emit_replay_cut(core, stream, reason, &*s, alive);
  // Liveness of each op's outputs, for the planner.
  size_t k = 0;
  for (auto& op : ss.plan) {
    op.alive.assign(op.outputs.size(), true);
    for (size_t o = 0; o < op.outputs.size(); ++o, ++k) op.alive[o] = k < alive.size() ? alive[k] : true;
  }
  adaptive_cut(ss, *s, count, core, stream);
  // Only now, with the held ops queued: a storage freed here is reused after they ran.
  ss.pinned.clear();
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

trace::TraceCache& trace_cache() {
  static auto* cache = new trace::TraceCache(fusion::Policy{}.hot_threshold);
  return *cache;
}

std::atomic<bool> g_lift_scalars{true};
bool active_policy_lifts() { return g_lift_scalars.load(std::memory_order_relaxed); }

std::atomic<bool> g_policy_lists_ops{false};
std::atomic<uint64_t> g_hot_threshold{fusion::Policy{}.hot_threshold};
bool active_policy_lists_ops() { return g_policy_lists_ops.load(std::memory_order_relaxed); }
uint64_t active_hot_threshold() { return g_hot_threshold.load(std::memory_order_relaxed); }

fusion::Policy active_policy() {
  std::lock_guard lock(g_policy_mutex);
  return g_policy;
}

void set_active_policy(const fusion::Policy& policy) {
  {
    std::lock_guard lock(g_policy_mutex);
    g_policy = policy;
  }
  g_lift_scalars = policy.lift_scalars;
  g_policy_lists_ops = !policy.fusible_ops.empty();
  g_hot_threshold = policy.hot_threshold;
  trace_cache().set_hot_threshold(policy.hot_threshold);
  // Open segments close; new segmenters follow the new policy.
  flush_all_windows();
  guard_policy_changed(policy);
  for (auto& core : g_states)
    for (auto& slot : core) {
      if (!slot) continue;
      std::lock_guard lock(slot->mutex);
      slot->segmenter = trace::Segmenter(default_segment_policy());
    }
}

trace::SegmentPolicy current_segment_policy() { return default_segment_policy(); }

StreamState& stream_state(c10::DeviceIndex core, int64_t stream) {
  auto& slot = g_states.at(static_cast<size_t>(core)).at(static_cast<size_t>(stream));
  if (!slot) {
    std::lock_guard lock(g_states_mutex);
    if (!slot) slot = std::make_unique<StreamState>(default_segment_policy());
  }
  return *slot;
}

StreamState* find_stream_state(c10::DeviceIndex core, int64_t stream) {
  return g_states.at(static_cast<size_t>(core)).at(static_cast<size_t>(stream)).get();
}

void flush_windows(c10::DeviceIndex core) {
  if (!observing() && !any_window_open()) return;
  for (int64_t s = 0; s < backend::kMaxStreamsPerCore; ++s) {
    StreamState* st = find_stream_state(core, s);
    if (st == nullptr) continue;
    std::lock_guard lock(st->mutex);
    flush_locked(*st, trace::CutReason::kSync, core, s);
  }
}

void note_view(const at::Tensor& base) {
  if (!observing() || !base.defined() || !base.has_storage()) return;
  const c10::DeviceIndex core = base.device().index();
  StreamState* st = find_stream_state(core, current_stream_id(core));
  if (st == nullptr) return;
  std::lock_guard lock(st->mutex);
  const uint64_t id = reinterpret_cast<uint64_t>(base.storage().unsafeGetStorageImpl());
  if (std::find(st->viewed.begin(), st->viewed.end(), id) == st->viewed.end()) st->viewed.push_back(id);
}

void flush_all_windows() {
  if (!backend::initialized()) return;
  for (int core = 0; core < device_count(); ++core) flush_windows(static_cast<c10::DeviceIndex>(core));
}

bool observing() { return trace::recording() || mode() == Mode::kAdaptive; }

uint64_t next_seq() { return g_seq.fetch_add(1, std::memory_order_relaxed) + 1; }

void set_stack_capture(std::string (*capture)()) { g_stack_capture.store(capture); }

void note_dispatch(std::unique_ptr<backend::OpWork>& owned, const OpInfo& info,
                   c10::DeviceIndex core, int64_t stream, uint64_t start_ns,
                   const std::vector<at::Tensor>& fresh_outputs) {
  backend::OpWork& work = *owned;  // plan_op_of may normalise a dim argument
  trace::SegmentOp op;
  op.op = info.id;
  op.signature = active_policy_lifts() ? work.record.lifted_hash() : work.record.hash();
  op.seq = work.seq;
  op.whole_run = info.foreach;
  op.inputs.reserve(work.record.tensors.size());
  for (const auto& m : work.record.tensors) op.inputs.push_back(m.defined && m.device >= 0 ? m.storage : 0);
  op.outputs.reserve(fresh_outputs.size());
  for (const auto& t : fresh_outputs)
    op.outputs.push_back(t.defined() ? reinterpret_cast<uint64_t>(t.storage().unsafeGetStorageImpl()) : 0);
  StreamState& ss = stream_state(core, stream);
  const bool adaptive = mode() == Mode::kAdaptive;
  const bool recording = trace::recording();
  thread_local std::vector<uint32_t> links;
  {
    std::lock_guard lock(ss.mutex);
    // A repeat of the open segment's start (a loop iteration): close it before this op.
    if (ss.segmenter.cut_before(op)) flush_locked(ss, trace::CutReason::kContent, core, stream);
    if (recording) {
      ReplayRecordState& r = replay_state(core, stream);
      r.last_seq = op.seq;
      r.linker.link(op.seq, std::span<const uint64_t>(op.inputs.data(), op.inputs.size()),
                    std::span<const uint64_t>(op.outputs.data(), op.outputs.size()), links);
    }
    // Storages of the open segment stay alive until its cut (their identities key it and
    // held ops use their memory); the caller still holds the inputs here.
    for (const auto& src : work.inputs)
      if (src.storage)
        ss.pinned.emplace_back(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(
            reinterpret_cast<c10::StorageImpl*>(src.storage.id)));
    if (adaptive) {
      fusion::PlanOp plan_op = plan_op_of(work, info);
      plan_op.outputs.assign(op.outputs.begin(), op.outputs.end());
      for (auto& v : plan_op.outputs) if (v == 0) v = -1;
      adaptive_take(ss, std::move(owned), std::move(plan_op), op.signature, core, stream);
    }
    for (const auto& t : fresh_outputs)
      if (t.defined()) ss.pinned.push_back(t.storage());
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
  }
  if (trace::recording()) {
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
  if (trace::recording()) {
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
}

SyncScope::SyncScope(c10::DeviceIndex core, const char* cause) : core_(core), cause_(cause) {
  flush_windows(core);
  if (!observing()) return;
  if (trace::recording()) start_ns_ = Recorder::instance().now_ns();
}

SyncScope::~SyncScope() {
  if (start_ns_ == 0 || !trace::recording()) return;
  auto& rec = Recorder::instance();
  Event e;
  e.time_ns = start_ns_;
  e.duration_ns = rec.now_ns() - start_ns_;
  e.kind = static_cast<uint8_t>(EventKind::kSync);
  e.core = static_cast<uint8_t>(core_);
  e.value = rec.intern_string(cause_);
  // The Python stack of the first sync with this cause in this recording.
  bool first = false;
  {
    std::lock_guard lock(g_seen_mutex);
    first = g_seen_causes.insert(cause_).second;
  }
  if (first) {
    if (auto capture = g_stack_capture.load()) {
      std::string stack = capture();
      if (!stack.empty()) e.aux = rec.intern_string(stack);
    }
  }
  rec.emit(e);
  emit_counters(core_, rec.now_ns());
}

void start_trace(const std::string& path, const std::string& user_json) {
  const Config& c = config();
  std::string meta = "{\"format_version\":" + std::to_string(trace::kFormatVersion) +
                     ",\"engine\":\"neuron-eager 0.1.0\",\"torch\":\"" TORCH_VERSION "\"" +
                     ",\"mode\":\"" + mode_name(mode()) + "\",\"cores\":" +
                     std::to_string(c.cores) + ",\"hbm_bytes\":" + std::to_string(c.hbm_bytes) +
                     ",\"pid\":" + std::to_string(getpid()) +
                     ",\"policy\":" + fusion::policy_json(active_policy()) +
                     ",\"segment_cache_keys_at_start\":" + std::to_string(trace_cache().size());
  // The caller's fields join ours: {"a":1} -> ,"a":1
  std::string user = user_json;
  while (!user.empty() && std::isspace(static_cast<unsigned char>(user.front()))) user.erase(0, 1);
  while (!user.empty() && std::isspace(static_cast<unsigned char>(user.back()))) user.pop_back();
  if (user.size() > 2 && user.front() == '{' && user.back() == '}')
    meta += "," + user.substr(1, user.size() - 2);
  meta += "}";
  {
    std::lock_guard lock(g_seen_mutex);
    g_seen_causes.clear();
  }
  g_replay_session.fetch_add(1);  // dataflow links start afresh in each recording
  std::string error;
  Recorder::instance().thread_id("host");
  TORCH_CHECK(Recorder::instance().start(path, meta, error), "neuron: ", error);
}

uint64_t stop_trace() {
  // Close open segments so their keys reach the file.
  flush_all_windows();
  return Recorder::instance().stop();
}

}  // namespace neuron::engine
