// Offline replay's input: a recorded trace's ops in seq order with their dataflow
// resolved into storage classes, recorded segments, timings, liveness and compiles.
#include "fusion/replay.h"

#include <algorithm>
#include <unordered_map>

#include "trace/dataflow.h"
#include "trace/segmenter.h"

namespace neuron::fusion {
namespace {

using trace::Event;
using trace::EventKind;
constexpr uint32_t kNone = ReplayTrace::kNone;

bool is(const Event& e, EventKind k) { return e.kind == static_cast<uint8_t>(k); }

// seq -> op index: a dense table when seqs are dense (they are: one counter), else a map.
struct SeqIndex {
  uint64_t base = 0;
  std::vector<uint32_t> dense;
  std::unordered_map<uint64_t, uint32_t> sparse;
  uint32_t operator()(uint64_t seq) const {
    if (!dense.empty()) return seq >= base && seq - base < dense.size() ? dense[seq - base] : kNone;
    auto it = sparse.find(seq);
    return it == sparse.end() ? kNone : it->second;
  }
};

}  // namespace

ReplayTrace prepare_replay(const Event* ev, size_t n) {
  ReplayTrace t;
  std::vector<const Event*> dispatch;
  for (size_t i = 0; i < n; ++i)
    if (is(ev[i], EventKind::kOpDispatch)) dispatch.push_back(&ev[i]);
  std::sort(dispatch.begin(), dispatch.end(),
            [](const Event* a, const Event* b) { return a->seq < b->seq; });
  const size_t ops = dispatch.size();
  SeqIndex index;
  if (ops) {
    const uint64_t lo = dispatch.front()->seq, span = dispatch.back()->seq - lo + 1;
    if (span <= 4 * ops + 1024) {
      index.base = lo;
      index.dense.assign(span, kNone);
      for (size_t i = 0; i < ops; ++i) index.dense[dispatch[i]->seq - lo] = static_cast<uint32_t>(i);
    } else {
      for (size_t i = 0; i < ops; ++i) index.sparse[dispatch[i]->seq] = static_cast<uint32_t>(i);
    }
  }
  std::unordered_map<uint32_t, uint32_t> stream_index;
  auto dense_stream = [&](const Event& e) {
    const uint32_t id = static_cast<uint32_t>(e.core) << 16 | e.stream;
    auto [it, inserted] = stream_index.try_emplace(id, static_cast<uint32_t>(t.stream_ids.size()));
    if (inserted) t.stream_ids.push_back(id);
    return it->second;
  };
  t.seq.resize(ops);
  t.signature.resize(ops);
  t.bytes.resize(ops);
  t.flops.assign(ops, 0);
  t.exec_ns.assign(ops, 0);
  t.op.resize(ops);
  t.stream.resize(ops);
  t.measured.assign(ops, 0);
  t.forced_after.assign(ops, 0);
  t.recorded.assign(ops, kNone);
  for (size_t i = 0; i < ops; ++i) {
    const Event& e = *dispatch[i];
    t.seq[i] = e.seq;
    t.signature[i] = e.value;
    t.bytes[i] = e.aux;
    t.op[i] = e.op;
    t.stream[i] = dense_stream(e);
  }

  // Timings, dataflow events, forced cuts and compiles.
  std::vector<std::pair<uint64_t, const Event*>> dataflow;  // (op index << 16 | part, event)
  std::vector<const Event*> cuts, executes, liveness, compiles, op_executes;
  for (size_t k = 0; k < n; ++k) {
    const Event& e = ev[k];
    if (is(e, EventKind::kOpExecute)) {
      const uint32_t i = index(e.seq);
      if (i != kNone) t.exec_ns[i] += e.duration_ns, t.measured[i] = 1, op_executes.push_back(&e);
    } else if (is(e, EventKind::kOpDataflow)) {
      const uint32_t i = index(e.seq);
      if (i == kNone) continue;
      if (e.flags == trace::kDataflowFlops) t.flops[i] = e.value;
      else dataflow.emplace_back(static_cast<uint64_t>(i) << 16 | e.flags, &e);
    } else if (is(e, EventKind::kStreamFlush)) {
      const uint32_t i = index(e.seq);
      if (i != kNone) t.forced_after[i] = static_cast<uint8_t>(e.flags);
      t.has_stream_flush = true;
    } else if (is(e, EventKind::kSegmentCut)) {
      cuts.push_back(&e);
    } else if (is(e, EventKind::kSegmentExecute)) {
      executes.push_back(&e);
    } else if (is(e, EventKind::kSegmentLiveness)) {
      liveness.push_back(&e);
    } else if (is(e, EventKind::kCompileEnd) && e.aux != 2) {
      // Tier-1 programs only: replay decides those. A tier-2 build (aux 2) ends whenever
      // its background compiler does, and costs seconds, not a tier-1 compile's micros.
      compiles.push_back(&e);
    }
  }
  auto by_time = [](const Event* a, const Event* b) { return a->time_ns < b->time_ns; };
  std::stable_sort(cuts.begin(), cuts.end(), by_time);
  std::stable_sort(compiles.begin(), compiles.end(), by_time);
  std::sort(dataflow.begin(), dataflow.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  t.has_dataflow = !dataflow.empty();

  // Storage classes: follow each input's link to the slot that touched its storage last.
  t.slot_begin.assign(ops + 1, 0);
  t.class_last_use.assign(1, 0);
  size_t d = 0;
  std::vector<uint32_t> codes;
  for (size_t i = 0; i < ops; ++i) {
    t.slot_begin[i] = static_cast<uint32_t>(t.slot_class.size());
    codes.clear();
    for (; d < dataflow.size() && (dataflow[d].first >> 16) == i; ++d)
      for (int c = 0; c < trace::kLinksPerEvent; ++c) {
        const uint32_t code = trace::dataflow_code(*dataflow[d].second, c);
        if (code != trace::kLinkEnd) codes.push_back(code);
      }
    for (size_t s = 0; s < codes.size(); ++s) {
      const uint32_t code = codes[s];
      const bool output = code == trace::kLinkOutput || code == trace::kLinkOutputUndefined;
      uint32_t cls = 0;
      if (code == trace::kLinkNoTensor || code == trace::kLinkOutputUndefined) {
        cls = 0;
      } else if (trace::is_link(code)) {
        const trace::Link link = trace::decode_link(code);
        const uint32_t ref = link.distance <= t.seq[i] ? index(t.seq[i] - link.distance) : kNone;
        const uint32_t ref_slots = ref == kNone ? 0
                                   : ref == i   ? static_cast<uint32_t>(s)
                                                : t.slot_begin[ref + 1] - t.slot_begin[ref];
        if (ref != kNone && link.slot < ref_slots) cls = t.slot_class[t.slot_begin[ref] + link.slot];
      }
      if (cls == 0 && code != trace::kLinkNoTensor && code != trace::kLinkOutputUndefined) {
        cls = static_cast<uint32_t>(t.class_last_use.size());
        t.class_last_use.push_back(0);
      }
      if (!output && cls != 0) t.class_last_use[cls] = static_cast<uint32_t>(i);
      t.slot_class.push_back(cls);
      t.slot_output.push_back(output);
      t.slot_dead.push_back(0);
    }
  }
  t.slot_begin[ops] = static_cast<uint32_t>(t.slot_class.size());

  // Recorded segments: the `length` ops of the stream from the first one.
  std::vector<std::vector<uint32_t>> stream_ops(t.stream_ids.size());
  std::vector<uint32_t> position(ops);
  for (size_t i = 0; i < ops; ++i) {
    position[i] = static_cast<uint32_t>(stream_ops[t.stream[i]].size());
    stream_ops[t.stream[i]].push_back(static_cast<uint32_t>(i));
  }
  std::unordered_map<uint64_t, uint32_t> segment_of_first_seq;
  for (const Event* e : cuts) {
    const uint32_t first = index(e->seq);
    if (first == kNone || e->aux == 0) continue;  // began before the recording
    const auto& list = stream_ops[t.stream[first]];
    if (position[first] + e->aux > list.size()) continue;
    RecordedSegment s;
    s.stream = t.stream[first];
    s.first = first;
    s.length = static_cast<uint32_t>(e->aux);
    s.key = e->value;
    s.reason = static_cast<uint8_t>(e->flags);
    const uint32_t id = static_cast<uint32_t>(t.segments.size());
    for (uint32_t k = 0; k < s.length; ++k) t.recorded[list[position[first] + k]] = id;
    const uint32_t last = s.last = list[position[first] + s.length - 1];
    if (s.reason == static_cast<uint8_t>(trace::CutReason::kSync) ||
        s.reason == static_cast<uint8_t>(trace::CutReason::kBarrier) ||
        s.reason == static_cast<uint8_t>(trace::CutReason::kRegion))
      if (t.forced_after[last] == 0) t.forced_after[last] = s.reason;
    segment_of_first_seq[e->seq] = id;
    t.segments.push_back(s);
  }
  // A fused occurrence's device time: its SegmentExecute plus the executions of its ops
  // that ran outside it (steps the engine queued before the cut).
  std::vector<uint8_t> nested(ops, 0);
  {
    std::unordered_map<uint16_t, std::vector<std::pair<uint64_t, uint64_t>>> spans;  // thread
    for (const Event* e : executes) spans[e->thread].emplace_back(e->time_ns, e->time_ns + e->duration_ns);
    for (auto& [thread, v] : spans) std::sort(v.begin(), v.end());
    for (const Event* e : op_executes) {
      auto it = spans.find(e->thread);
      if (it == spans.end()) continue;
      const auto& v = it->second;
      auto after = std::upper_bound(v.begin(), v.end(), std::make_pair(e->time_ns, ~uint64_t{0}));
      if (after != v.begin() && e->time_ns < std::prev(after)->second) nested[index(e->seq)] = 1;
    }
  }
  // A segment may run as several work items (groups launched before the cut, then the
  // rest): every SegmentExecute whose first op lies in it counts.
  for (const Event* e : executes) {
    const uint32_t i = index(e->seq);
    if (i == kNone || t.recorded[i] == kNone) continue;
    RecordedSegment& s = t.segments[t.recorded[i]];
    if (s.key != e->value) continue;
    s.fused = true;
    s.fused_ns += static_cast<double>(e->duration_ns);
  }
  for (RecordedSegment& s : t.segments) {
    if (!s.fused) continue;
    const auto& list = stream_ops[s.stream];
    for (uint32_t k = 0; k < s.length; ++k) {
      const uint32_t i = list[position[s.first] + k];
      if (t.measured[i] && !nested[i]) s.fused_ns += static_cast<double>(t.exec_ns[i]);
    }
    auto& ft = t.fused_time[s.key];
    ft.first += s.fused_ns;
    ft.second += 1;
  }
  for (const Event* e : liveness) {
    auto it = segment_of_first_seq.find(e->seq);
    if (it == segment_of_first_seq.end()) continue;
    const RecordedSegment& s = t.segments[it->second];
    const auto& list = stream_ops[s.stream];
    uint64_t out = 0;
    for (uint32_t k = 0; k < s.length; ++k) {
      const uint32_t i = list[position[s.first] + k];
      for (uint32_t slot = t.slot_begin[i]; slot < t.slot_begin[i + 1]; ++slot) {
        if (!t.slot_output[slot]) continue;
        const uint64_t chunk = out / 128, bit = out % 128;
        ++out;
        if (chunk != e->flags) continue;
        const uint64_t word = bit < 64 ? e->value : e->aux;
        if (word >> (bit % 64) & 1) t.slot_dead[slot] = 1;
      }
    }
  }
  double compile_total = 0;
  for (const Event* e : compiles) {
    t.compiled_keys.push_back(e->value);
    compile_total += static_cast<double>(e->duration_ns);
  }
  t.compile_ns_mean = compiles.empty() ? 0 : compile_total / static_cast<double>(compiles.size());
  return t;
}

}  // namespace neuron::fusion
