#include "fusion/replay_costs.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

namespace neuron::fusion {

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

double fused_ratio(const ReplayTrace& t, const CostModel& cost, const std::vector<double>& op_ns) {
  double ratio = cost.fused_ratio_default;
  if (cost.source == CostSource::kMeasured) {
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
  return ratio;
}

double trn2_fused_ns(const ReplayTrace& t, const Trn2Model& model, const std::vector<uint32_t>& open) {
  std::unordered_set<uint32_t> produced, seen;
  double hbm = 0, flops = 0, elements = 0;
  for (uint32_t i : open) {
    const uint32_t slots = std::max<uint32_t>(1, t.slot_begin[i + 1] - t.slot_begin[i]);
    const double slot_bytes = static_cast<double>(t.bytes[i]) / slots;
    for (uint32_t s = t.slot_begin[i]; s < t.slot_begin[i + 1]; ++s) {
      const uint32_t c = t.slot_class[s];
      if (c == 0) continue;
      const bool spill = slot_bytes > model.sbuf_bytes;
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
  return trn2_segment_ns(model, static_cast<uint64_t>(hbm), static_cast<uint64_t>(flops),
                         static_cast<uint64_t>(elements));
}

}  // namespace neuron::fusion
