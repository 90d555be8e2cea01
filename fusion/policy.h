// Every fusion heuristic in one unit, with named defaults: how hot a segment must be,
// where segments are cut, which ops may fuse, scalar lifting, shape specialisation, tier
// choice and the cost gates, tier 2's trials, retries and tiles, and when the worker
// spreads free work over threads. Loadable from a policy file (NEURON_FUSION_POLICY) or
// from Python; correctness never depends on these values.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fusion/guard.h"
#include "fusion/planner.h"
#include "fusion/stream_guard.h"
#include "trace/segmenter.h"

namespace neuron::fusion {

enum class Tier { kInstant, kNative, kAuto };
// exact: every result bit-equal to CPU eager (formulas ATen's own, or left to tier 1).
// fast: tier-2 kernels may use formulas that are not ATen's (float32 gelu, gelu with
// approximate='tanh'), within documented bounds; a kernel's trial accepts results within
// fast_rtol / fast_atol of tier 1's.
enum class Numerics : uint8_t { kExact, kFast };
// The numerics every policy starts with unless it sets its own (NEURON_NUMERICS; exact
// until the engine sets it at start-up).
Numerics default_numerics();
void set_default_numerics(Numerics numerics);

struct Policy {
  std::string name = "default";
  uint32_t hot_threshold = 3;         // occurrences before a segment may compile
  // A graph torch.compile(backend="neuron") captured gets programs at first sight for this
  // many segment keys (shapes it sees); later keys wait for hot_threshold like any other.
  uint32_t region_max_programs = 64;
  uint32_t max_segment_length = 256;  // ops per segment at most
  uint32_t rolling_window = 4;        // ops in the rolling content hash
  uint32_t rolling_bits = 4;          // content cut when the low bits are zero (~1 in 2^bits)
  bool rolling_shapes = false;        // the rolling hash reads op shapes too (trace/segmenter.h)
  // A segment of at least this many ops is cut before its first op repeats after the same
  // rolling_window ops (a loop body the hash never cuts); 0: max_segment_length / 2.
  uint32_t loop_cut_min_ops = 0;
  bool cut_after_matmul = true;       // a run of matmul-class ops ends a segment
  bool foreach_runs_whole = true;     // a content cut never splits a run of _foreach_ ops
  bool lift_scalars = true;           // scalar arguments become program inputs
  bool specialize_shapes = true;      // one program per shape (false: shape-generic)
  Tier tier = Tier::kAuto;
  uint32_t min_fusible_ops = 2;       // smaller groups stay per op
  // Holding a segment's first ops for a ready program whose first ops they match delays
  // them; when the stream goes on differently (a key that only occurs at host reads,
  // beside a loop body that starts alike) they run per op late. A program stops holding
  // once the ops held for it that went on differently outnumber the ops of its key's
  // occurrences hold_miss_ratio times over, after hold_min_missed_ops such ops; its key's
  // occurrences keep counting (both figures halve after 64 x hold_min_missed_ops), so a
  // key that becomes common holds again.
  uint32_t hold_min_missed_ops = 256;
  double hold_miss_ratio = 4.0;
  // Settling: after settle_cuts cuts in a row on a stream that fused nothing and had
  // nothing to decide (keys demoted by the guard, rejected, or seen for the first time),
  // the stream stops recording for a stretch of ops: its ops go straight to the queue as
  // in eager mode, so a workload fusion cannot help pays almost nothing for adaptive mode.
  // The stretch starts at settle_first_ops and doubles each time recording resumes and
  // finds nothing to do, up to settle_max_ops; a cut that fused or had something to
  // decide resets it. 0 settle_cuts: always record.
  uint32_t settle_cuts = 8;
  uint32_t settle_first_ops = 64;
  uint32_t settle_max_ops = 4096;
  // The stream trial (fusion/stream_guard.h): whether recording pays at all. A stream
  // whose ops average less than settle_trial_max_op_us of wall time is tried after
  // settle_trial_after_ops recorded ops: stretches of about settle_trial_stretch_ms
  // unrecorded and recorded in pairs; where unrecorded wins with confidence the stream
  // passes settle_trial_period_ops ops unrecorded (doubling per win in a row), then is
  // tried again; otherwise the next trial waits twice as many ops. settle_cuts 0 (always
  // record) and guard false turn it off too.
  bool settle_trial = true;
  uint64_t settle_trial_after_ops = 2048;
  double settle_trial_max_op_us = 50;
  double settle_trial_stretch_ms = 4;
  uint64_t settle_trial_period_ops = 65536;
  // Tile groups over fewer elements stay per op: their operands fit in cache, so tiling
  // saves no traffic, while holding the ops until the cut costs the host/device overlap.
  uint64_t min_group_elements = 65536;
  // Tile groups run tile by tile, sized so one tile of every distinct full-size operand
  // fits in this many bytes: larger tiles mean fewer kernel calls, smaller ones less
  // traffic beyond the cache.
  uint64_t tile_bytes = static_cast<uint64_t>(kDefaultTileBytes);
  // Memory a held window may take: a tile group's fresh outputs total at most this many
  // bytes (the planner splits longer runs), and a window whose held ops' outputs pass it
  // runs them per op. Held ops' outputs are allocated when they are dispatched and kept
  // until they run, so without a bound memory would grow with how far the host runs ahead
  // (a long segment of one tile group). 0: no bound.
  uint64_t hold_bytes = uint64_t{512} << 20;
  double compile_cost_us_instant = 20.0;     // cost gate: expected cost of a tier-1 build
  double compile_cost_us_native = 700000.0;  // and of a native (tier-2) build (~0.5-0.6 s here
                                             // with the precompiled prelude, 1.7 s without)
  double expected_repeats = 10000.0;         // repeats assumed for a hot segment
  double per_op_saving_us = 2.0;             // saving per fused op per run
  uint32_t native_min_runs = 5;              // tier-1 runs of a group measured before tier 2
  double native_saving = 0.3;                // expected tier-2 saving, share of tier-1 time
  uint32_t native_trials = 3;                // tier-2 runs side by side with tier 1 before its verdict
  uint32_t native_max_build_failures = 3;    // failed tier-2 builds before a group stays on tier 1
  double native_retry_after_us = 5000000.0;  // wait before a group's build is retried (5 s)
  double native_retry_growth = 4.0;          // and its factor per further failure (5 s, 20 s, ...)
  uint32_t tier1_choice_runs = 3;            // runs timed each way (tiled, whole) before tier 1 picks
  // Tier-2 pointwise kernels run over about native_tiles tiles, each a multiple of 64
  // elements (the scalar tail falls where tier 1's does) and at least this many.
  uint64_t native_min_tile_elements = 16384;
  uint32_t native_tiles = 64;
  uint64_t foreach_piece_elements = 65536;   // tier-2 foreach work unit (a multiple of 64)
  // Work whose bits do not depend on the thread count (free items, tier-2 kernels) that
  // touches fewer elements stays on one thread even while the host waits: waking a helper
  // costs more than it saves.
  uint64_t spread_elements = uint64_t{1} << 18;
  // A free matmul's work (multiply-adds / 32) from which it takes CPU eager's thread count
  // even while the host is busy (the host soon waits for it).
  uint64_t large_matmul_work = uint64_t{1} << 19;
  // Backpressure: a host more than queue_max_ops items ahead of a stream's worker waits
  // until half of them ran (the bound a CUDA launch queue gives).
  uint32_t queue_max_ops = 1024;
  // A stream more than deep_backlog_ops items behind counts as far behind: free items take
  // CPU eager's thread count, as while a host thread waits for it.
  uint32_t deep_backlog_ops = 256;
  // A host thread blocked on a stream this long frees its OpenMP team and lets the
  // worker's team spin (the host will not need a core soon).
  uint32_t long_wait_us = 5000;
  // Thread-count trials of matmul and reduction geometries (backend/thread_trial.cpp):
  // tried at the thread_trial_sightings-th sighting, thread_trial_runs times on random
  // inputs; outputs under thread_trial_min_output elements keep CPU eager's count.
  uint32_t thread_trial_sightings = 3;
  uint32_t thread_trial_runs = 2;
  uint32_t thread_trial_min_output = 256;
  std::vector<std::string> fusible_ops;      // empty: the built-in elementwise set
  GuardSettings guard;                       // the online guard (fusion/guard.h): knobs guard_*
  Numerics numerics = default_numerics();    // knob numerics (NEURON_NUMERICS sets the default)
  double fast_rtol = 1e-5;                   // fast numerics: a trial's relative tolerance
  double fast_atol = 1e-5;                   // and absolute tolerance

  // Whether compiling a segment of n fusible ops pays: saving x repeats > compile cost.
  bool should_compile(uint32_t fusible_ops_in_segment, Tier tier_to_build) const;
  // Whether a fused group whose tier-1 runs took tier1_total_ns over tier1_runs runs gets
  // a tier-2 build: always with tier native, never with instant; with auto once
  // native_min_runs runs are measured and their mean x native_saving x expected_repeats
  // beats compile_cost_us_native.
  bool should_build_native(uint64_t tier1_total_ns, uint64_t tier1_runs) const;
  // After a group's n-th failed build (n >= 1): whether it stays on tier 1 for good, and
  // otherwise how long to wait before the next try.
  bool native_gives_up(uint32_t failures) const { return failures >= native_max_build_failures; }
  uint64_t native_retry_delay_ns(uint32_t failures) const;
  // Elements per tile of a tier-2 pointwise kernel over numel elements.
  int64_t native_tile(int64_t numel) const;
  // Whether a ready program still holds the first ops of segments that start like it,
  // after its key's occurrences counted `hit_ops` ops and `missed_ops` ops held for it
  // went on differently (see hold_min_missed_ops).
  bool holds_prefix(uint64_t hit_ops, uint64_t missed_ops) const {
    return prefix_holds(hit_ops, missed_ops, hold_min_missed_ops, hold_miss_ratio);
  }
  static bool prefix_holds(uint64_t hits, uint64_t misses, uint32_t min_misses, double miss_ratio) {
    return misses < min_misses || static_cast<double>(misses) <= miss_ratio * static_cast<double>(hits);
  }
  // The count of hits plus misses at which both halve.
  static uint64_t prefix_decay_at(uint32_t min_misses) { return uint64_t{64} * (min_misses > 0 ? min_misses : 1); }
  // The stream trial's settings under this policy (its statistics are the key guard's).
  StreamTrialSettings stream_trial() const {
    StreamTrialSettings s;
    // settle_cuts 0 (always record) and guard false (every hot key fused) turn it off too.
    s.enabled = settle_trial && settle_cuts > 0 && guard.enabled;
    s.after_ops = settle_trial_after_ops;
    s.max_op_us = settle_trial_max_op_us;
    s.stretch_ms = settle_trial_stretch_ms;
    s.settled_ops = settle_trial_period_ops;
    s.settled_max_ops = std::max<uint64_t>(settle_trial_period_ops, uint64_t{1} << 21);
    s.min_pairs = guard.min_pairs;
    s.max_pairs = std::max(guard.max_pairs, guard.min_pairs);
    s.alpha = guard.alpha;
    s.margin = guard.margin;
    return s;
  }
  // Ops a stream lets pass unrecorded in its n-th settled stretch in a row (n >= 0).
  static uint32_t settle_stretch(uint32_t first_ops, uint32_t max_ops, uint32_t n) {
    const uint64_t ops = static_cast<uint64_t>(first_ops) << std::min<uint32_t>(n, 32);
    return static_cast<uint32_t>(std::min<uint64_t>(ops, std::max(first_ops, max_ops)));
  }
};

// Ops that end a segment when cut_after_matmul is on (the engine and replay share it).
const std::vector<std::string>& matmul_class_ops();
// The segmenter's settings under a policy (the live engine and replay share it);
// matmul_ops: the interned ids of matmul_class_ops(), used when cut_after_matmul is on.
trace::SegmentPolicy segment_policy_of(const Policy& policy, const std::vector<uint32_t>& matmul_ops);

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
