// Policies as text: every knob by name (range, meaning, parser, printer), setting one,
// parsing and loading policy files, and printing a policy (JSON, the knob list).
#include "fusion/policy.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>

namespace neuron::fusion {
namespace {

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t\r\n"), b = s.find_last_not_of(" \t\r\n");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

template <typename T>
bool parse_uint(const std::string& v, uint64_t lo, uint64_t hi, T& out) {
  if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos || v.size() > 15)
    return false;
  uint64_t n = std::strtoull(v.c_str(), nullptr, 10);
  if (n < lo || n > hi) return false;
  out = static_cast<T>(n);
  return true;
}

bool parse_double(const std::string& v, double lo, double hi, double& out) {
  char* end = nullptr;
  double d = std::strtod(v.c_str(), &end);
  if (v.empty() || end == nullptr || *end != '\0' || !std::isfinite(d) || d < lo || d > hi)
    return false;
  out = d;
  return true;
}

bool parse_bool(const std::string& v, bool& out) {
  if (v == "true" || v == "1" || v == "yes" || v == "on") return out = true, true;
  if (v == "false" || v == "0" || v == "no" || v == "off") return out = false, true;
  return false;
}

struct Knob {
  const char* name;
  const char* range;
  const char* meaning;
  std::function<bool(Policy&, const std::string&)> set;
  std::function<std::string(const Policy&)> get;
};

std::string fmt(double d) {
  std::ostringstream s;
  s << d;
  return s.str();
}

// A whole-number knob, range checked (and, with multiple > 1, divisibility) when set.
template <typename T>
Knob uint_knob(const char* name, const char* range, uint64_t lo, uint64_t hi, T Policy::*field,
               const char* meaning, uint64_t multiple = 1) {
  return {name, range, meaning,
          [=](Policy& p, const std::string& v) {
            T n{};
            if (!parse_uint(v, lo, hi, n) || n % multiple != 0) return false;
            p.*field = n;
            return true;
          },
          [=](const Policy& p) { return std::to_string(p.*field); }};
}

Knob double_knob(const char* name, const char* range, double lo, double hi, double Policy::*field,
                 const char* meaning) {
  return {name, range, meaning,
          [=](Policy& p, const std::string& v) { return parse_double(v, lo, hi, p.*field); },
          [=](const Policy& p) { return fmt(p.*field); }};
}

// Knobs of the guard's settings, ranges checked when set.
Knob guard_uint(const char* name, const char* range, uint64_t lo, uint64_t hi,
                uint64_t (*get)(const GuardSettings&), void (*set)(GuardSettings&, uint64_t),
                const char* meaning) {
  return {name, range, meaning,
          [=](Policy& p, const std::string& v) {
            uint64_t n = 0;
            if (!parse_uint(v, lo, hi, n)) return false;
            set(p.guard, n);
            return true;
          },
          [=](const Policy& p) { return std::to_string(get(p.guard)); }};
}

Knob guard_double(const char* name, const char* range, double lo, double hi,
                  double GuardSettings::*field, const char* meaning) {
  return {name, range, meaning,
          [=](Policy& p, const std::string& v) { return parse_double(v, lo, hi, p.guard.*field); },
          [=](const Policy& p) { return fmt(p.guard.*field); }};
}

const std::vector<Knob>& knobs() {
  static const std::vector<Knob> k = {
      {"name", "any text", "a label written into traces",
       [](Policy& p, const std::string& v) { p.name = v; return !v.empty(); },
       [](const Policy& p) { return "\"" + p.name + "\""; }},
      uint_knob("hot_threshold", "integer 1..1000000", 1, 1000000, &Policy::hot_threshold,
                "occurrences before a segment may compile"),
      uint_knob("region_max_programs", "integer 0..1000000", 0, 1000000, &Policy::region_max_programs,
                "segment keys of one torch.compile graph compiled at first sight; later keys (new shapes) wait for hot_threshold"),
      uint_knob("hold_min_missed_ops", "integer 0..1000000", 0, 1000000, &Policy::hold_min_missed_ops,
                "ops held for a ready program that went on differently before hold_miss_ratio may stop it holding"),
      double_knob("hold_miss_ratio", "number 0..1000000", 0, 1e6, &Policy::hold_miss_ratio,
                  "a ready program stops holding segment starts once ops held for it in vain exceed this many per op of its key's occurrences"),
      uint_knob("settle_cuts", "integer 0..1000000 (0: always record)", 0, 1000000, &Policy::settle_cuts,
                "cuts in a row that fused nothing and had nothing to decide before a stream stops recording for a stretch"),
      uint_knob("settle_first_ops", "integer 1..1000000000", 1, 1000000000, &Policy::settle_first_ops,
                "ops of a stream's first unrecorded stretch (it doubles while recording finds nothing to do)"),
      uint_knob("settle_max_ops", "integer 1..1000000000", 1, 1000000000, &Policy::settle_max_ops,
                "ops of the longest unrecorded stretch"),
      {"settle_trial", "true or false",
       "the stream trial: a stream of cheap ops is timed in stretches unrecorded and recorded, and passes unrecorded where that wins",
       [](Policy& p, const std::string& v) { return parse_bool(v, p.settle_trial); },
       [](const Policy& p) { return std::string(p.settle_trial ? "true" : "false"); }},
      uint_knob("settle_trial_after_ops", "integer 2..1000000000", 2, 1000000000, &Policy::settle_trial_after_ops,
                "recorded ops of a stream before its first stream trial"),
      double_knob("settle_trial_max_op_us", "number 0..1000000", 0, 1e6, &Policy::settle_trial_max_op_us,
                  "only streams whose ops average less wall time than this (microseconds) are tried"),
      double_knob("settle_trial_stretch_ms", "number 0.01..10000", 0.01, 1e4, &Policy::settle_trial_stretch_ms,
                  "wall time of one stretch of a stream trial (its ops from the stream's rate, 256..16384)"),
      uint_knob("settle_trial_period_ops", "integer 1..1000000000", 1, 1000000000, &Policy::settle_trial_period_ops,
                "ops a stream passes unrecorded after its trial found unrecorded faster (doubles per such verdict in a row)"),
      uint_knob("max_segment_length", "integer 1..4096", 1, 4096, &Policy::max_segment_length,
                "ops per segment at most"),
      uint_knob("rolling_window", "integer 1..64", 1, 64, &Policy::rolling_window,
                "ops hashed by the rolling content hash"),
      uint_knob("loop_cut_min_ops", "integer 0..4096 (0: max_segment_length / 2)", 0, 4096, &Policy::loop_cut_min_ops,
                "a segment of at least this many ops is cut where a loop body starts again (with rolling cuts on)"),
      uint_knob("rolling_bits", "integer 0..16 (0 disables content cuts)", 0, 16, &Policy::rolling_bits,
                "content cut when that many low hash bits are zero"),
      {"rolling_shapes", "true or false",
       "the rolling content hash reads op shapes too (false: ops alone, so a loop body is cut alike whatever its batch size)",
       [](Policy& p, const std::string& v) { return parse_bool(v, p.rolling_shapes); },
       [](const Policy& p) { return std::string(p.rolling_shapes ? "true" : "false"); }},
      {"cut_after_matmul", "true or false", "a run of matmul-class ops (mm, bmm, addmm, attention, ...) ends a segment",
       [](Policy& p, const std::string& v) { return parse_bool(v, p.cut_after_matmul); },
       [](const Policy& p) { return std::string(p.cut_after_matmul ? "true" : "false"); }},
      {"foreach_runs_whole", "true or false",
       "a content cut inside a run of _foreach_ ops (an optimizer step, one fused group) moves to the run's end",
       [](Policy& p, const std::string& v) { return parse_bool(v, p.foreach_runs_whole); },
       [](const Policy& p) { return std::string(p.foreach_runs_whole ? "true" : "false"); }},
      {"lift_scalars", "true or false", "scalar arguments become program inputs",
       [](Policy& p, const std::string& v) { return parse_bool(v, p.lift_scalars); },
       [](const Policy& p) { return std::string(p.lift_scalars ? "true" : "false"); }},
      {"specialize_shapes", "true or false", "one program per shape",
       [](Policy& p, const std::string& v) { return parse_bool(v, p.specialize_shapes); },
       [](const Policy& p) { return std::string(p.specialize_shapes ? "true" : "false"); }},
      {"tier", "instant, native or auto", "which compiler builds hot segments",
       [](Policy& p, const std::string& v) {
         if (v == "instant") p.tier = Tier::kInstant;
         else if (v == "native") p.tier = Tier::kNative;
         else if (v == "auto") p.tier = Tier::kAuto;
         else return false;
         return true;
       },
       [](const Policy& p) {
         return std::string(p.tier == Tier::kInstant ? "\"instant\""
                            : p.tier == Tier::kNative ? "\"native\"" : "\"auto\"");
       }},
      uint_knob("min_fusible_ops", "integer 1..4096", 1, 4096, &Policy::min_fusible_ops,
                "smaller groups stay per op"),
      uint_knob("min_group_elements", "integer 0..1099511627776", 0, uint64_t{1} << 40,
                &Policy::min_group_elements,
                "tile groups over fewer elements stay per op (their operands fit in cache)"),
      uint_knob("tile_bytes", "integer 65536..1073741824", uint64_t{1} << 16, uint64_t{1} << 30,
                &Policy::tile_bytes, "tile groups: bytes of one tile of every distinct full-size operand"),
      uint_knob("hold_bytes", "integer 0..1099511627776 (0: no bound)", 0, uint64_t{1} << 40,
                &Policy::hold_bytes,
                "fresh-output bytes a tile group, and a window of held ops, may hold before they run"),
      double_knob("compile_cost_us_instant", "number 0..1e9", 0, 1e9, &Policy::compile_cost_us_instant,
                  "cost gate: expected cost of a tier-1 build (us)"),
      double_knob("compile_cost_us_native", "number 0..1e10", 0, 1e10, &Policy::compile_cost_us_native,
                  "cost gate: expected cost of a native build (us)"),
      double_knob("expected_repeats", "number 0..1e12", 0, 1e12, &Policy::expected_repeats,
                  "repeats assumed for a hot segment"),
      double_knob("per_op_saving_us", "number 0..1e6", 0, 1e6, &Policy::per_op_saving_us,
                  "saving per fused op per run (us)"),
      uint_knob("native_min_runs", "integer 1..1000000", 1, 1000000, &Policy::native_min_runs,
                "tier-1 runs of a fused group measured before its tier-2 build is considered"),
      double_knob("native_saving", "number 0..1", 0, 1, &Policy::native_saving,
                  "cost gate: expected tier-2 saving as a share of the group's measured tier-1 time"),
      uint_knob("native_trials", "integer 1..1000", 1, 1000, &Policy::native_trials,
                "tier-2 runs side by side with tier 1 (equal bits each time) before the faster one stays"),
      uint_knob("native_max_build_failures", "integer 1..100", 1, 100, &Policy::native_max_build_failures,
                "failed tier-2 builds after which a group stays on tier 1"),
      double_knob("native_retry_after_us", "number 0..1e10", 0, 1e10, &Policy::native_retry_after_us,
                  "wait after a group's first failed tier-2 build before it is retried (us)"),
      double_knob("native_retry_growth", "number 1..100", 1, 100, &Policy::native_retry_growth,
                  "factor on that wait per further failed build"),
      uint_knob("tier1_choice_runs", "integer 1..1000", 1, 1000, &Policy::tier1_choice_runs,
                "tier-1 runs of a group timed tile by tile and as many on whole tensors before the faster way stays"),
      uint_knob("native_min_tile_elements", "integer 64..1073741824, a multiple of 64", 64, uint64_t{1} << 30,
                &Policy::native_min_tile_elements, "tier-2 pointwise kernels: elements per tile at least", 64),
      uint_knob("native_tiles", "integer 1..65536", 1, 65536, &Policy::native_tiles,
                "tier-2 pointwise kernels: tiles a group is cut into (to spread it over threads)"),
      uint_knob("foreach_piece_elements", "integer 64..1073741824, a multiple of 64", 64, uint64_t{1} << 30,
                &Policy::foreach_piece_elements,
                "tier-2 foreach kernels: elements per work unit (larger tensors are cut into pieces)", 64),
      uint_knob("spread_elements", "integer 0..1099511627776", 0, uint64_t{1} << 40, &Policy::spread_elements,
                "work whose bits do not depend on the thread count touching fewer elements stays on one "
                "thread even while the host waits (tier-2 groups: their program's policy; other work: "
                "the active policy)"),
      uint_knob("large_matmul_work", "integer 0..1099511627776", 0, uint64_t{1} << 40, &Policy::large_matmul_work,
                "a matmul free of the thread count with at least this work (multiply-adds / 32) takes CPU "
                "eager's thread count even while the host is busy"),
      uint_knob("queue_max_ops", "integer 2..1000000", 2, 1000000, &Policy::queue_max_ops,
                "backpressure: a host this many items ahead of a stream's worker waits until half of them ran"),
      uint_knob("deep_backlog_ops", "integer 1..1000000", 1, 1000000, &Policy::deep_backlog_ops,
                "a stream with more items queued counts as far behind: free items take CPU eager's thread count"),
      uint_knob("long_wait_us", "integer 0..10000000", 0, 10000000, &Policy::long_wait_us,
                "a host blocked on a stream this long (us) frees its OpenMP team and lets the worker's team spin"),
      uint_knob("thread_trial_sightings", "integer 1..99", 1, 99, &Policy::thread_trial_sightings,
                "a matmul or reduction geometry is tried for thread-count freedom at this sighting"),
      uint_knob("thread_trial_runs", "integer 1..16", 1, 16, &Policy::thread_trial_runs,
                "runs on random inputs, one thread against CPU eager's count, equal bits in every one"),
      uint_knob("thread_trial_min_output", "integer 1..1073741824", 1, uint64_t{1} << 30,
                &Policy::thread_trial_min_output,
                "outputs with fewer elements keep CPU eager's thread count untried (too few to show a changed order)"),
      {"fusible_ops", "comma-separated op names (aten::add.Tensor, ...)",
       "ops that may join a fused group; empty: the built-in elementwise set",
       [](Policy& p, const std::string& v) {
         p.fusible_ops.clear();
         std::stringstream ss(v);
         std::string item;
         while (std::getline(ss, item, ',')) {
           item = trim(item);
           if (item.empty()) continue;
           if (item.find("::") == std::string::npos) return false;
           p.fusible_ops.push_back(item);
         }
         return true;
       },
       [](const Policy& p) {
         std::string s = "[";
         for (size_t i = 0; i < p.fusible_ops.size(); ++i)
           s += (i ? ",\"" : "\"") + p.fusible_ops[i] + "\"";
         return s + "]";
       }},
      {"numerics", "exact or fast",
       "exact: results bit-equal to CPU eager; fast: tier-2 kernels may use formulas that are not ATen's (float32 gelu), within documented bounds",
       [](Policy& p, const std::string& v) {
         if (v == "exact") p.numerics = Numerics::kExact;
         else if (v == "fast") p.numerics = Numerics::kFast;
         else return false;
         return true;
       },
       [](const Policy& p) { return std::string(p.numerics == Numerics::kFast ? "\"fast\"" : "\"exact\""); }},
      double_knob("fast_rtol", "number 0..0.01", 0, 0.01, &Policy::fast_rtol,
                  "fast numerics: a tier-2 kernel's trial accepts results within this relative difference of tier 1's"),
      double_knob("fast_atol", "number 0..0.01", 0, 0.01, &Policy::fast_atol,
                  "fast numerics: and within this absolute difference"),
      {"guard", "true or false",
       "the online guard: a hot key's program runs interleaved with per-op runs of the same key and is demoted unless it wins",
       [](Policy& p, const std::string& v) { return parse_bool(v, p.guard.enabled); },
       [](const Policy& p) { return std::string(p.guard.enabled ? "true" : "false"); }},
      {"guard_family", "true or false",
       "guard: keys that differ only in shapes, scalars or dtypes share one trial and its verdict",
       [](Policy& p, const std::string& v) { return parse_bool(v, p.guard.share_family); },
       [](const Policy& p) { return std::string(p.guard.share_family ? "true" : "false"); }},
      {"guard_remember", "true or false",
       "guard: demotions are kept in the cache folder (per policy and thread count) and a process that finds a key's demotion starts it per op without a trial",
       [](Policy& p, const std::string& v) { return parse_bool(v, p.guard.remember); },
       [](const Policy& p) { return std::string(p.guard.remember ? "true" : "false"); }},
      guard_uint("guard_min_pairs", "integer 1..1000", 1, 1000,
                 [](const GuardSettings& g) -> uint64_t { return g.min_pairs; },
                 [](GuardSettings& g, uint64_t n) { g.min_pairs = static_cast<uint32_t>(n); },
                 "guard: (fused, per-op) pairs of occurrences before a verdict"),
      guard_uint("guard_max_pairs", "integer 1..10000", 1, 10000,
                 [](const GuardSettings& g) -> uint64_t { return g.max_pairs; },
                 [](GuardSettings& g, uint64_t n) { g.max_pairs = static_cast<uint32_t>(n); },
                 "guard: pairs after which an undecided trial keeps per-op runs"),
      guard_double("guard_alpha", "number 0.0001..0.5", 1e-4, 0.5, &GuardSettings::alpha,
                   "guard: one-sided sign-test p-value a verdict needs"),
      guard_double("guard_margin", "number 0..1", 0, 1, &GuardSettings::margin,
                   "guard: a program is kept only if its median time ratio to per op is at most 1 - margin (1: never kept, every trial demotes)"),
      guard_uint("guard_early_pairs", "integer 1..1000", 1, 1000,
                 [](const GuardSettings& g) -> uint64_t { return g.early_pairs; },
                 [](GuardSettings& g, uint64_t n) { g.early_pairs = static_cast<uint32_t>(n); },
                 "guard: a program slower by guard_early_loss in this many first pairs is demoted at once"),
      guard_double("guard_early_loss", "number 1..100", 1, 100, &GuardSettings::early_loss,
                   "guard: the ratio (fused / per op) that counts as a clear loss"),
      guard_uint("guard_retry_after", "integer 1..1000000000", 1, 1000000000,
                 [](const GuardSettings& g) { return g.retry_after; },
                 [](GuardSettings& g, uint64_t n) { g.retry_after = n; },
                 "guard: occurrences of a demoted key before its first re-trial (doubles per demotion)"),
      guard_uint("guard_retry_max", "integer 1..1000000000000", 1, 1000000000000ull,
                 [](const GuardSettings& g) { return g.retry_max; },
                 [](GuardSettings& g, uint64_t n) { g.retry_max = n; },
                 "guard: the longest backoff between re-trials, in occurrences"),
  };
  return k;
}

std::string knob_names() {
  std::string s;
  for (const auto& k : knobs()) s += (s.empty() ? "" : ", ") + std::string(k.name);
  return s + ", base";
}

}  // namespace

bool set_policy_value(Policy& policy, const std::string& key, const std::string& value,
                      std::string& error) {
  for (const auto& k : knobs()) {
    if (key != k.name) continue;
    Policy trial = policy;
    if (!k.set(trial, value)) {
      error = "policy key '" + key + "': value '" + value + "' is not valid: expected " + k.range;
      return false;
    }
    policy = trial;
    return true;
  }
  error = "unknown policy key '" + key + "' (allowed: " + knob_names() + ")";
  return false;
}

std::optional<Policy> parse_policy(const std::string& text, const std::string& origin,
                                   std::string& error) {
  Policy p;
  std::istringstream in(text);
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    const auto hash = line.find('#');
    if (hash != std::string::npos) line = line.substr(0, hash);
    line = trim(line);
    if (line.empty()) continue;
    const auto eq = line.find('=');
    const std::string where = origin + " line " + std::to_string(number) + ": ";
    if (eq == std::string::npos) {
      error = where + "expected 'key = value', got '" + line + "'";
      return std::nullopt;
    }
    std::string key = trim(line.substr(0, eq)), value = trim(line.substr(eq + 1));
    if (value.size() >= 2 && value.front() == '"' && value.back() == '"')
      value = value.substr(1, value.size() - 2);
    if (key == "base") {
      auto base = builtin_policy(value);
      if (!base) {
        error = where + "policy key 'base': unknown built-in policy '" + value +
                "' (allowed: default, aggressive, conservative, never)";
        return std::nullopt;
      }
      p = *base;
      continue;
    }
    std::string why;
    if (!set_policy_value(p, key, value, why)) {
      error = where + why;
      return std::nullopt;
    }
  }
  return p;
}

std::optional<Policy> load_policy_file(const std::string& path, std::string& error) {
  std::ifstream f(path);
  if (!f) {
    error = "cannot read policy file '" + path + "'";
    return std::nullopt;
  }
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_policy(ss.str(), "policy file '" + path + "'", error);
}

std::string policy_json(const Policy& p) {
  std::string s = "{";
  for (const auto& k : knobs()) s += (s.size() > 1 ? ",\"" : "\"") + std::string(k.name) + "\":" + k.get(p);
  return s + "}";
}

std::string describe_policy_knobs() {
  Policy d;
  std::string s;
  for (const auto& k : knobs())
    s += std::string(k.name) + " (default " + k.get(d) + "; " + k.range + "): " + k.meaning + "\n";
  return s;
}

}  // namespace neuron::fusion
