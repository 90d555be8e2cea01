// The registry of ready programs, the controller's counters, its resets and its reaction
// to a new policy.
#include "engine/adaptive_registry.h"

#include <ATen/Context.h>

#include <algorithm>

#include "engine/adaptive_guard.h"
#include "engine/compiled_region.h"
#include "engine/engine.h"
#include "engine/guard_memory.h"
#include "engine/recording.h"
#include "engine/stream_state.h"
#include "fusion/native.h"
#include "trace/recorder.h"

namespace neuron::engine {

Registry& registry() {
  static auto* r = new Registry();
  return *r;
}

trace::Counter g_programs{"programs"}, g_segments_fused{"segments_fused"},
    g_ops_fused_segments{"ops_in_fused_segments"}, g_ops_tile_groups{"ops_in_tile_groups"},
    g_ops_per_op{"ops_per_op"}, g_divergences{"divergences"}, g_blacklisted{"blacklisted"},
    g_failures{"fusion_failures"}, g_prefix_skips{"prefix_holds_skipped"},
    g_settles{"settled_stretches"}, g_settled_ops{"ops_settled"},
    g_hold_overflows{"hold_overflows"};
std::atomic<int> g_open_windows{0};

bool fusion_allowed() {
  return (mode() == Mode::kAdaptive || any_compiled_region()) &&
         !at::globalContext().deterministicAlgorithms();
}

void fallback_event(const char* reason, uint8_t core) {
  if (!trace::recording()) return;
  auto& rec = trace::Recorder::instance();
  rec.emit_ended(trace::EventKind::kFallback, rec.intern_string(reason), 0, 0, core);
}

void note_prefix(ReadyProgram& program, bool hit, uint64_t ops) {
  ops = std::max<uint64_t>(ops, 1);
  const uint64_t hits = (hit ? program.prefix_hits.fetch_add(ops, std::memory_order_relaxed) + ops
                             : program.prefix_hits.load(std::memory_order_relaxed));
  const uint64_t misses = (hit ? program.prefix_misses.load(std::memory_order_relaxed)
                               : program.prefix_misses.fetch_add(ops, std::memory_order_relaxed) + ops);
  if (hits + misses >= fusion::Policy::prefix_decay_at(active_hold_min_missed_ops())) {
    // Recent behaviour counts: a key whose prefix became common (or rare) shows it soon.
    program.prefix_hits.store(hits / 2, std::memory_order_relaxed);
    program.prefix_misses.store(misses / 2, std::memory_order_relaxed);
  }
}

bool holds_prefix(const ReadyProgram& program) {
  return fusion::Policy::prefix_holds(program.prefix_hits.load(std::memory_order_relaxed),
                                      program.prefix_misses.load(std::memory_order_relaxed),
                                      active_hold_min_missed_ops(), active_hold_miss_ratio());
}

bool any_window_open() { return g_open_windows.load(std::memory_order_relaxed) > 0; }

bool attach_guard(Registry& r, ReadyProgram& program, const fusion::GuardSettings& settings) {
  bool started = false;
  if (settings.share_family && program.family != 0) {
    Registry::FamilyGuard& f = r.families[program.family];
    if (!f.guard) {
      f.guard = std::make_shared<fusion::KeyGuard>(program.family, settings);
      f.seen = std::make_shared<std::atomic<uint64_t>>(0);
      if (!seed_from_memory(*f.guard, settings)) {
        f.guard->start_trial();
        started = true;
      }
    }
    program.guard = f.guard;
    program.guard_seen = f.seen;
    program.family_guard = true;
  } else {
    program.guard = std::make_shared<fusion::KeyGuard>(program.key, settings);
    program.guard_seen = std::make_shared<std::atomic<uint64_t>>(0);
    program.family_guard = false;
    if (!seed_from_memory(*program.guard, settings)) {
      program.guard->start_trial();
      started = true;
    }
  }
  // A later member follows its family: on trial with it, or its verdict's mode.
  program.on_trial = program.guard->on_trial();
  program.per_op = program.guard->next_mode() == fusion::RunMode::kPerOp;
  return started;
}

void guard_policy_changed(const fusion::Policy& policy) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.families.clear();
  for (auto& [key, rp] : r.ready) {
    rp->prefix_hits = 0;  // every program holds again under the new policy
    rp->prefix_misses = 0;
    if (!policy.guard.enabled) {  // no guard: every program runs fused
      rp->guard.reset();
      rp->guard_seen.reset();
      rp->on_trial = false;
      rp->per_op = false;
      continue;
    }
    // Kept programs keep their guard (a family's stays shared by the members it has);
    // demoted and never guarded ones start a trial under the new settings, at once.
    if (rp->guard && !rp->per_op.load() && !rp->on_trial.load()) continue;
    const bool retrial = rp->guard != nullptr;
    if (rp->guard && rp->on_trial.load() && !rp->family_guard) continue;  // its trial goes on
    if (attach_guard(r, *rp, policy.guard)) count_guard_trial(retrial);
    trace_cache().transition(key, rp->on_trial.load() ? trace::SegmentState::kOnTrial
                                                      : trace::SegmentState::kDemoted);
  }
}

void reset_fusion_state() {
  synchronize_all("reset fusion state");
  fusion::NativeCompiler::instance().wait_idle();
  Registry& r = registry();
  {
    std::lock_guard lock(r.mutex);
    r.ready.clear();
    r.by_first_signature.clear();
    r.rejected.clear();
    r.families.clear();
  }
  trace_cache().clear();
  forget_first_sight_programs();
  // Settling and the stream trials' verdicts are decisions too: every stream records again.
  flush_all_windows();
  restart_segmenters();
}

}  // namespace neuron::engine
