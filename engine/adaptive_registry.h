// The adaptive controller: hot segment keys get a fused program (tier 1, planned in
// microseconds); ops that match a prefix of a ready program wait in the window; a full
// match launches the segment as one work item, anything else runs per op. Correctness
// never depends on a decision here: every path produces the per-op results.
// Here: the registry of ready programs and what the controller's files share
// (adaptive_window.cpp holds and matches ops, adaptive_cut.cpp decides at the cut).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "backend/native_group.h"
#include "engine/stream_state.h"
#include "fusion/guard.h"
#include "fusion/planner.h"
#include "fusion/policy.h"
#include "trace/counters.h"

namespace neuron::engine {

struct ReadyProgram {
  uint64_t key = 0;
  std::vector<int64_t> words;        // the segment's canonical form: a key hit is verified
  std::vector<uint64_t> signatures;  // per op, for prefix matching
  std::vector<uint32_t> step_of_op;  // per op: its step in the program
  std::shared_ptr<const fusion::Program> program;
  std::vector<std::shared_ptr<backend::NativeGroup>> natives;  // per step (tier 2)
  std::shared_ptr<std::atomic<uint64_t>> failures = std::make_shared<std::atomic<uint64_t>>(0);
  // The online guard (null when the policy turns it off: always fused). While per_op is
  // set the key's occurrences run per op with nothing held: a trial's per-op turn, or
  // a demoted key.
  std::shared_ptr<fusion::KeyGuard> guard;
  // Occurrences the guard has seen (its backoff counts them): the key's own, or with a
  // guard shared by a family (GuardSettings::share_family) every member's.
  std::shared_ptr<std::atomic<uint64_t>> guard_seen;
  uint64_t family = 0;                // trace::Segment::family
  bool family_guard = false;          // the guard is the family's
  std::atomic<bool> on_trial{false};
  std::atomic<bool> per_op{false};
  std::atomic<bool> tier2_noted{false};
  // A key demoted on tier 1's figures is re-tried once as soon as a tier-2 kernel of its
  // arrives (built, to be tried against tier 1, or accepted).
  std::atomic<bool> tier2_retried{false};
  // Ops of the key's occurrences, and ops held for it that went on differently: whether
  // the program still holds segment starts (Policy::holds_prefix).
  std::atomic<uint64_t> prefix_hits{0};
  std::atomic<uint64_t> prefix_misses{0};
};

// Counts an occurrence of the program's key (hit: its length in ops) or `ops` ops held
// for it that went on differently (miss); both halve at Policy::prefix_decay_at.
void note_prefix(ReadyProgram& program, bool hit, uint64_t ops);
// Whether the program may hold the first ops of a segment that starts like it.
bool holds_prefix(const ReadyProgram& program);

struct Registry {
  std::mutex mutex;
  std::unordered_map<uint64_t, std::shared_ptr<ReadyProgram>> ready;
  std::unordered_map<uint64_t, std::vector<std::shared_ptr<ReadyProgram>>> by_first_signature;
  std::unordered_set<uint64_t> rejected;  // keys not worth fusing, or blacklisted
  // Guards shared by the keys of a family (GuardSettings::share_family), by family.
  struct FamilyGuard {
    std::shared_ptr<fusion::KeyGuard> guard;
    std::shared_ptr<std::atomic<uint64_t>> seen;
  };
  std::unordered_map<uint64_t, FamilyGuard> families;
};

// The guard of a new program of `key` in `family`: its family's when the policy shares
// them (made, on trial, with the first member), else its own on trial. Under r.mutex.
// Returns whether a trial started.
bool attach_guard(Registry& r, ReadyProgram& program, const fusion::GuardSettings& settings);

Registry& registry();

// The controller's counters (trace/counters.h: neuron_eager.counters() lists them).
extern trace::Counter g_programs, g_segments_fused, g_ops_fused_segments, g_ops_tile_groups,
    g_ops_per_op, g_divergences, g_blacklisted, g_failures, g_prefix_skips,
    g_settles, g_settled_ops, g_hold_overflows;
extern std::atomic<int> g_open_windows;  // streams holding ops in their window

// Adaptive mode, and no deterministic algorithms asked for.
bool fusion_allowed();
// Traces why ops run per op (a Fallback event).
void fallback_event(const char* reason, uint8_t core);
// Queues the window's held ops per op and stops holding (adaptive_window.cpp).
void enqueue_per_op(StreamState& state, c10::DeviceIndex core, int64_t stream);
// Whether any stream holds ops in its window.
bool any_window_open();
// A new policy: without a guard every program runs fused; with one, demoted and never
// guarded programs start a trial under the new settings at once.
void guard_policy_changed(const fusion::Policy& policy);

}  // namespace neuron::engine
