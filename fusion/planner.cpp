#include "fusion/planner.h"

#include <algorithm>
#include <unordered_map>

namespace neuron::fusion {

int64_t tile_elements(int64_t operands, int64_t element_bytes, int64_t budget) {
  int64_t n = budget / std::max<int64_t>(1, operands * element_bytes);
  n = std::max<int64_t>(64, n / 64 * 64);
  return n;
}

Program plan(const std::vector<PlanOp>& ops, uint32_t min_group, uint64_t min_elements,
             uint64_t max_group_bytes) {
  Program program;
  // Last op index that reads each value (anywhere in the segment).
  std::unordered_map<int64_t, uint32_t> last_use;
  for (uint32_t i = 0; i < ops.size(); ++i)
    for (int64_t v : ops[i].inputs)
      if (v >= 0) last_use[v] = i;

  uint32_t i = 0;
  while (i < ops.size()) {
    if (ops[i].list >= 2) {
      // Foreach ops over lists of one length, while each storage stays with one index.
      const int64_t n = ops[i].list;
      std::unordered_map<int64_t, int64_t> index_of;  // value -> list index
      auto fits = [&](const PlanOp& o) {
        std::vector<std::pair<int64_t, int64_t>> seen;
        auto check = [&](int64_t v, int64_t idx) {
          if (v < 0) return true;
          auto it = index_of.find(v);
          if (it != index_of.end()) return it->second == idx;
          for (const auto& [sv, si] : seen)
            if (sv == v && si != idx) return false;
          seen.emplace_back(v, idx);
          return true;
        };
        if (o.list != n || o.inputs.size() % static_cast<size_t>(n) != 0) return false;
        for (size_t k = 0; k < o.inputs.size(); ++k)
          if (!check(o.inputs[k], static_cast<int64_t>(k) % n)) return false;
        for (size_t k = 0; k < o.outputs.size(); ++k)
          if (!check(o.outputs[k], static_cast<int64_t>(k) % n)) return false;
        for (const auto& [sv, si] : seen) index_of[sv] = si;
        return true;
      };
      uint32_t j = i;
      while (j < ops.size() && fits(ops[j])) ++j;
      if (j - i >= std::max<uint32_t>(min_group, 2)) {
        Step group{Step::kForeachGroup, i, j - i, {}, 0, 0, n};
        // A fresh output used only inside the group and dead afterwards (a temporary
        // list, as AdamW's square roots) need not reach memory.
        for (uint32_t k = i; k < j; ++k) {
          std::vector<bool> scratch;
          for (size_t o = 0; o < ops[k].outputs.size(); ++o) {
            const bool alive = o < ops[k].alive.size() ? ops[k].alive[o] : true;
            auto lu = last_use.find(ops[k].outputs[o]);
            const bool s = !alive && lu != last_use.end() && lu->second > k && lu->second < j;
            scratch.push_back(s);
            program.scratch_values += s ? 1 : 0;
          }
          group.scratch.push_back(std::move(scratch));
        }
        program.fused_ops += j - i;
        program.steps.push_back(std::move(group));
        i = j;
        continue;
      }
      if (j == i) j = i + 1;
      for (uint32_t k = i; k < j; ++k) program.steps.push_back(Step{Step::kExtern, k, 1, {}, 0, 0, 0});
      i = j;
      continue;
    }
    uint32_t j = i;
    // A run: same element count, and one row length among the ops that need rows.
    int64_t row = 0;
    uint64_t held = 0;
    std::vector<int64_t> produced;  // values the run's ops wrote so far
    while (j < ops.size() && ops[j].pointwise) {
      const PlanOp& o = ops[j];
      const uint64_t bytes = static_cast<uint64_t>(std::max<int64_t>(o.out_bytes, 0));
      if (max_group_bytes != 0 && j - i >= 2) {
        if (held + bytes > max_group_bytes) break;
        // An op that reads nothing the run wrote starts an independent chain (the next
        // loop iteration, often): joining it saves no traffic, only kernel calls, which
        // no longer matter once the run holds a sixteenth of the bound.
        const bool independent = std::none_of(o.inputs.begin(), o.inputs.end(), [&](int64_t v) {
          return v >= 0 && std::find(produced.begin(), produced.end(), v) != produced.end();
        });
        if (independent && held >= max_group_bytes / 16) break;
      }
      held += bytes;
      produced.insert(produced.end(), o.outputs.begin(), o.outputs.end());
      if (o.numel == ops[i].numel && (o.row == 0 || row == 0 || o.row == row)) {
        if (o.row != 0) row = o.row;
      } else if (!(row != 0 && o.per_row && o.row == 0 && o.numel * row == ops[i].numel)) {
        break;  // per-row values join only a group whose rows are known
      }
      ++j;
    }
    const uint32_t run = j - i;
    if (run == 0 || run < std::max<uint32_t>(min_group, 2) ||
        static_cast<uint64_t>(std::max<int64_t>(ops[i].numel, 0)) < min_elements) {
      // Not worth a group: per op (a pointwise run shorter than the minimum or over too
      // few elements, or extern).
      const uint32_t n = std::max<uint32_t>(run, 1);
      for (uint32_t k = i; k < i + n; ++k) program.steps.push_back(Step{Step::kExtern, k, 1, {}, 0, 0, 0});
      i += n;
      continue;
    }
    Step group{Step::kTileGroup, i, run, {}, ops[i].numel, row, 0};
    for (uint32_t k = i; k < j; ++k) {
      std::vector<bool> scratch;
      for (size_t o = 0; o < ops[k].outputs.size(); ++o) {
        const int64_t v = ops[k].outputs[o];
        const bool alive = o < ops[k].alive.size() ? ops[k].alive[o] : true;
        auto lu = last_use.find(v);
        const bool read_after_group = lu != last_use.end() && lu->second >= j;
        const bool read_inside = lu != last_use.end() && lu->second > k && lu->second < j;
        // A value used only inside the group and dead afterwards never reaches memory.
        const bool s = !alive && !read_after_group && read_inside;
        scratch.push_back(s);
        program.scratch_values += s ? 1 : 0;
      }
      group.scratch.push_back(std::move(scratch));
    }
    program.fused_ops += run;
    program.steps.push_back(std::move(group));
    i = j;
  }
  return program;
}

}  // namespace neuron::fusion
