// Every fusion heuristic in one unit, with named defaults: how hot a segment must be,
// where segments are cut, which ops may fuse, scalar lifting, shape specialisation, tier
// choice and the cost gate. Loadable from a policy file (NEURON_FUSION_POLICY) or from
// Python; correctness never depends on these values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fusion/guard.h"
#include "fusion/planner.h"

namespace neuron::fusion {

enum class Tier { kInstant, kNative, kAuto };

struct Policy {
  std::string name = "default";
  uint32_t hot_threshold = 3;         // occurrences before a segment may compile
  uint32_t max_segment_length = 256;  // ops per segment at most
  uint32_t rolling_window = 4;        // ops in the rolling content hash
  uint32_t rolling_bits = 4;          // content cut when the low bits are zero (~1 in 2^bits)
  bool cut_after_matmul = true;       // a run of matmul-class ops ends a segment
  bool foreach_runs_whole = true;     // a content cut never splits a run of _foreach_ ops
  bool lift_scalars = true;           // scalar arguments become program inputs
  bool specialize_shapes = true;      // one program per shape (false: shape-generic)
  Tier tier = Tier::kAuto;
  uint32_t min_fusible_ops = 2;       // smaller groups stay per op
  // Tile groups over fewer elements stay per op: their operands fit in cache, so tiling
  // saves no traffic, while holding the ops until the cut costs the host/device overlap.
  uint64_t min_group_elements = 65536;
  // Tile groups run tile by tile, sized so one tile of every distinct full-size operand
  // fits in this many bytes: larger tiles mean fewer kernel calls, smaller ones less
  // traffic beyond the cache.
  uint64_t tile_bytes = static_cast<uint64_t>(kDefaultTileBytes);
  double compile_cost_us_instant = 20.0;     // cost gate: expected cost of a tier-1 build
  double compile_cost_us_native = 2000000.0; // and of a native (tier-2) build (~2 s here)
  double expected_repeats = 10000.0;         // repeats assumed for a hot segment
  double per_op_saving_us = 2.0;             // saving per fused op per run
  uint32_t native_min_runs = 5;              // tier-1 runs of a group measured before tier 2
  double native_saving = 0.3;                // expected tier-2 saving, share of tier-1 time
  std::vector<std::string> fusible_ops;      // empty: the built-in elementwise set
  GuardSettings guard;                       // the online guard (fusion/guard.h): knobs guard_*

  // Whether compiling a segment of n fusible ops pays: saving x repeats > compile cost.
  bool should_compile(uint32_t fusible_ops_in_segment, Tier tier_to_build) const;
};

// Ops that end a segment when cut_after_matmul is on (the engine and replay share it).
const std::vector<std::string>& matmul_class_ops();

// The built-in policies: default, aggressive, conservative, never.
std::optional<Policy> builtin_policy(const std::string& name);
std::vector<std::string> builtin_policy_names();

// Parses a policy file: `key = value` lines, `#` comments; `base = NAME` starts from a
// built-in policy. On a bad file returns std::nullopt and sets error to one message
// naming the file, the line, the key and what is allowed.
std::optional<Policy> parse_policy(const std::string& text, const std::string& origin,
                                   std::string& error);
std::optional<Policy> load_policy_file(const std::string& path, std::string& error);
// Sets one knob by name (Python's policy objects use this); false + error when invalid.
bool set_policy_value(Policy& policy, const std::string& key, const std::string& value,
                      std::string& error);
// The policy as JSON, for traces and tools.
std::string policy_json(const Policy& policy);
// The documented knobs: name, default, range and meaning, one per line.
std::string describe_policy_knobs();

}  // namespace neuron::fusion
