// Offline replay of the controller's decisions over a prepared trace (replay_trace.cpp)
// under one policy, with predicted device time (replay_costs.cpp).
#include "fusion/replay.h"

#include <unordered_map>

#include "fusion/replay_costs.h"
#include "trace/segmenter.h"

namespace neuron::fusion {
namespace {

constexpr uint32_t kNone = ReplayTrace::kNone;

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
  const double ratio = fused_ratio(t, options.cost, op_ns);
  r.fused_ratio = ratio;

  // The engine's settings; the cut list comes resolved (matmul class if on, plus extras).
  trace::SegmentPolicy sp = segment_policy_of(policy, {});
  sp.cut_after = options.cut_after_ops;
  std::vector<bool> whole_run;
  for (uint32_t id : options.whole_run_ops) {
    if (id >= whole_run.size()) whole_run.resize(id + 1, false);
    whole_run[id] = true;
  }
  std::vector<StreamReplay> streams;
  for (size_t s = 0; s < t.stream_ids.size(); ++s) streams.push_back({trace::Segmenter(sp), {}});

  std::unordered_map<uint64_t, KeyState> keys;
  std::unordered_map<uint64_t, uint64_t> alias;  // recomputed key -> recorded key
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
    k.fused_ns = trn2_fused_ns(t, options.cost.trn2, open);
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
    op.kind = t.op[i] < options.op_kinds.size() ? options.op_kinds[t.op[i]] : 0;
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
