#include "fusion/replay.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <unordered_set>

#include "trace/dataflow.h"
#include "trace/segmenter.h"

namespace neuron::fusion {
namespace {

using trace::Event;
using trace::EventKind;
constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();

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
    } else if (is(e, EventKind::kCompileEnd)) {
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
        s.reason == static_cast<uint8_t>(trace::CutReason::kBarrier))
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

namespace {

// Predicted time of each op run on its own.
std::vector<double> per_op_costs(const ReplayTrace& t, const CostModel& cost) {
  const size_t ops = t.seq.size();
  std::vector<double> ns(ops, 0);
  if (cost.source == CostSource::kTrn2) {
    for (size_t i = 0; i < ops; ++i) {
      const uint32_t slots = std::max<uint32_t>(1, t.slot_begin[i + 1] - t.slot_begin[i]);
      ns[i] = trn2_op_ns(cost.trn2, t.bytes[i], t.flops[i], t.bytes[i] / (4 * slots));
    }
    return ns;
  }
  // Measured: the op's own execution; else the median of its signature's executions (the
  // first, cold runs of a signature are often outliers); else its op's time per byte;
  // else the trace's time per byte.
  std::unordered_map<uint64_t, std::vector<double>> by_signature;
  std::unordered_map<uint32_t, std::pair<double, double>> by_op;  // ns, bytes
  double all_ns = 0, all_bytes = 0;
  for (size_t i = 0; i < ops; ++i) {
    if (!t.measured[i]) continue;
    by_signature[t.signature[i]].push_back(static_cast<double>(t.exec_ns[i]));
    auto& o = by_op[t.op[i]];
    o.first += static_cast<double>(t.exec_ns[i]);
    o.second += static_cast<double>(t.bytes[i]);
    all_ns += static_cast<double>(t.exec_ns[i]);
    all_bytes += static_cast<double>(t.bytes[i]);
  }
  std::unordered_map<uint64_t, double> median;
  for (auto& [signature, v] : by_signature) {
    std::nth_element(v.begin(), v.begin() + static_cast<ptrdiff_t>(v.size() / 2), v.end());
    median[signature] = v[v.size() / 2];
  }
  for (size_t i = 0; i < ops; ++i) {
    if (t.measured[i]) {
      ns[i] = static_cast<double>(t.exec_ns[i]);
      continue;
    }
    auto s = median.find(t.signature[i]);
    if (s != median.end()) {
      ns[i] = s->second;
      continue;
    }
    auto o = by_op.find(t.op[i]);
    if (o != by_op.end() && o->second.second > 0) ns[i] = o->second.first / o->second.second * t.bytes[i];
    else if (all_bytes > 0) ns[i] = all_ns / all_bytes * static_cast<double>(t.bytes[i]);
  }
  return ns;
}

struct KeyState {
  uint32_t decision = 0;  // index into result.keys
  uint64_t count = 0;
  bool ready = false, rejected = false, costed = false;
  uint32_t ready_at = 0;  // op index of the cut that built the program
  double fused_ns = 0;    // the key's fused time when no occurrence gives its own
  double per_op_sum = 0, fused_sum = 0;
};

struct StreamReplay {
  trace::Segmenter segmenter;
  std::vector<uint32_t> open;  // op indices of the open segment
};

}  // namespace

ReplayResult replay(const ReplayTrace& t, const ReplayOptions& options) {
  const Policy& policy = options.policy;
  ReplayResult r;
  const std::vector<double> op_ns = per_op_costs(t, options.cost);

  // Fused time of segments never measured fused: per-op time x the ratio the trace's
  // fused segments show (measured mode).
  double ratio = options.cost.fused_ratio_default;
  if (options.cost.source == CostSource::kMeasured) {
    double fused = 0, per_op = 0;
    for (const auto& s : t.segments) {
      if (!s.fused) continue;
      fused += s.fused_ns;
      uint32_t i = s.first;
      for (uint32_t k = 0; k < s.length; ++i)
        if (t.stream[i] == s.stream) per_op += op_ns[i], ++k;
    }
    if (fused > 0 && per_op > 0) ratio = fused / per_op;
  }
  r.fused_ratio = ratio;

  trace::SegmentPolicy sp;
  sp.max_length = policy.max_segment_length;
  sp.rolling_window = policy.rolling_window;
  sp.rolling_mask = (uint64_t{1} << policy.rolling_bits) - 1;
  sp.use_rolling_cut = policy.rolling_bits > 0;
  sp.cut_after = options.cut_after_ops;
  sp.keep_runs_whole = policy.foreach_runs_whole;
  std::vector<bool> whole_run;
  for (uint32_t id : options.whole_run_ops) {
    if (id >= whole_run.size()) whole_run.resize(id + 1, false);
    whole_run[id] = true;
  }
  std::vector<StreamReplay> streams;
  for (size_t s = 0; s < t.stream_ids.size(); ++s) streams.push_back({trace::Segmenter(sp), {}});

  std::unordered_map<uint64_t, KeyState> keys;
  std::unordered_map<uint64_t, uint64_t> alias;  // recomputed key -> recorded key
  std::unordered_set<uint32_t> produced, seen;
  std::vector<bool> alive;

  auto fused_cost = [&](KeyState& k, uint64_t key, const std::vector<uint32_t>& open,
                        double per_op) {
    if (k.costed) return k.fused_ns;
    k.costed = true;
    if (options.cost.source == CostSource::kMeasured) {
      auto it = t.fused_time.find(key);
      k.fused_ns = it != t.fused_time.end() ? it->second.first / static_cast<double>(it->second.second)
                                            : per_op * ratio;
      return k.fused_ns;
    }
    // Trn2: HBM traffic of external inputs (once each), live outputs and spills.
    produced.clear();
    seen.clear();
    double hbm = 0, flops = 0, elements = 0;
    for (uint32_t i : open) {
      const uint32_t slots = std::max<uint32_t>(1, t.slot_begin[i + 1] - t.slot_begin[i]);
      const double slot_bytes = static_cast<double>(t.bytes[i]) / slots;
      for (uint32_t s = t.slot_begin[i]; s < t.slot_begin[i + 1]; ++s) {
        const uint32_t c = t.slot_class[s];
        if (c == 0) continue;
        const bool spill = slot_bytes > options.cost.trn2.sbuf_bytes;
        if (t.slot_output[s]) {
          produced.insert(c);
          const bool live = !t.slot_dead[s] || t.class_last_use[c] > open.back();
          if (live || spill) hbm += slot_bytes;
        } else if (produced.count(c)) {
          if (spill) hbm += slot_bytes;
        } else if (seen.insert(c).second) {
          hbm += slot_bytes;
        }
      }
      flops += static_cast<double>(t.flops[i]);
      elements += static_cast<double>(t.bytes[i]) / (4.0 * slots);
    }
    k.fused_ns = trn2_segment_ns(options.cost.trn2, static_cast<uint64_t>(hbm),
                                 static_cast<uint64_t>(flops), static_cast<uint64_t>(elements));
    return k.fused_ns;
  };

  auto close = [&](StreamReplay& st, trace::CutReason reason, uint32_t end) {
    if (st.open.empty()) return;
    // Liveness at this cut: as recorded when the recording cut here too; otherwise dead
    // outputs stay dead unless a later op still reads them.
    alive.clear();
    for (uint32_t j : st.open) {
      const uint32_t rec = t.recorded[j];
      const bool same_end = rec != kNone && t.segments[rec].last == end;
      for (uint32_t s = t.slot_begin[j]; s < t.slot_begin[j + 1]; ++s) {
        if (!t.slot_output[s]) continue;
        const uint32_t c = t.slot_class[s];
        bool live = !t.slot_dead[s];
        if (!same_end && c != 0 && t.class_last_use[c] > end) live = true;
        alive.push_back(live);
      }
    }
    auto seg = st.segmenter.flush(reason, alive);
    if (!seg) return;
    const uint32_t first = st.open.front();
    uint64_t key = seg->key;
    const uint32_t rec = t.recorded[first];
    const bool coincides = rec != kNone && t.segments[rec].first == first && t.segments[rec].last == end;
    if (coincides) {
      ++r.matched_segments;
      if (t.segments[rec].key != key) {
        ++r.key_mismatches;
        alias[key] = t.segments[rec].key;
        key = t.segments[rec].key;
      }
    } else if (auto a = alias.find(key); a != alias.end()) {
      key = a->second;
    }
    auto [it, inserted] = keys.try_emplace(key);
    KeyState& k = it->second;
    if (inserted) {
      k.decision = static_cast<uint32_t>(r.keys.size());
      KeyDecision d;
      d.key = key;
      d.length = seg->length;
      d.first_op = t.op[first];
      d.decision = "cold";
      r.keys.push_back(d);
    }
    KeyDecision& d = r.keys[k.decision];
    ++k.count;
    ++d.occurrences;
    double per_op = 0;
    for (uint32_t j : st.open) per_op += op_ns[j];
    double fused_ns = fused_cost(k, key, st.open, per_op);
    // The occurrence's own measurement when the recording fused it too.
    if (options.cost.source == CostSource::kMeasured && coincides && t.segments[rec].fused &&
        t.segments[rec].key == key)
      fused_ns = t.segments[rec].fused_ns;
    k.per_op_sum += per_op;
    const bool fused = k.ready && k.ready_at < first;
    r.ops += seg->length;
    ++r.occurrences;
    if (fused) {
      ++d.fused;
      k.fused_sum += fused_ns;
      r.ops_fused += seg->length;
      ++r.occurrences_fused;
      r.fused_ns += fused_ns;
    } else {
      r.per_op_ns += per_op;
    }
    // Hot keys without a program get one, if the cost gate (or the hook) agrees.
    if (!k.ready && !k.rejected && k.count >= policy.hot_threshold) {
      ReplaySegment info{key, seg->length, t.op[first], k.count, per_op, fused_ns};
      const bool worth = options.should_compile
                             ? options.should_compile(info)
                             : policy.should_compile(seg->length, Tier::kInstant);
      if (seg->length >= 2 && worth) {
        k.ready = true;
        k.ready_at = end;
        d.compiled_at = static_cast<int64_t>(k.count);
        d.decision = "fused";
        ++r.compiles;
        r.compiled_keys.push_back(key);
        r.compile_ns += options.cost.source == CostSource::kMeasured && t.compile_ns_mean > 0
                            ? t.compile_ns_mean
                            : policy.compile_cost_us_instant * 1e3;
        if (policy.tier != Tier::kInstant && policy.should_compile(seg->length, Tier::kNative)) {
          d.native = true;
          ++r.native_compiles;
        }
      } else {
        k.rejected = true;
        d.decision = seg->length < 2 ? "rejected: single op" : "rejected: cost gate";
      }
    }
    r.occ_stream.push_back(t.stream[first]);
    r.occ_first_seq.push_back(t.seq[first]);
    r.occ_length.push_back(seg->length);
    r.occ_key.push_back(key);
    r.occ_reason.push_back(static_cast<uint8_t>(reason));
    r.occ_fused.push_back(fused);
    st.open.clear();
  };

  trace::SegmentOp op;
  const size_t ops = t.seq.size();
  for (size_t i = 0; i < ops; ++i) {
    StreamReplay& st = streams[t.stream[i]];
    op.op = t.op[i];
    op.signature = t.signature[i];
    op.seq = t.seq[i];
    op.whole_run = t.op[i] < whole_run.size() && whole_run[t.op[i]];
    op.inputs.clear();
    op.outputs.clear();
    for (uint32_t s = t.slot_begin[i]; s < t.slot_begin[i + 1]; ++s)
      (t.slot_output[s] ? op.outputs : op.inputs).push_back(t.slot_class[s]);
    if (st.segmenter.cut_before(op) && !st.open.empty()) close(st, trace::CutReason::kContent, st.open.back());
    st.open.push_back(static_cast<uint32_t>(i));
    if (auto reason = st.segmenter.add(op)) close(st, *reason, static_cast<uint32_t>(i));
    if (t.forced_after[i] && !st.open.empty())
      close(st, static_cast<trace::CutReason>(t.forced_after[i]), static_cast<uint32_t>(i));
  }
  for (auto& st : streams)
    if (!st.open.empty()) close(st, trace::CutReason::kFlush, st.open.back());
  for (const auto& [key, k] : keys) {
    KeyDecision& d = r.keys[k.decision];
    d.per_op_ns = k.per_op_sum / static_cast<double>(d.occurrences);
    d.fused_ns = d.fused ? k.fused_sum / static_cast<double>(d.fused) : k.fused_ns;
  }
  r.device_ns = r.per_op_ns + r.fused_ns;
  return r;
}

}  // namespace neuron::fusion
