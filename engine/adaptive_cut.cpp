// The adaptive controller at a segment's cut: launch the segment fused or queue held ops
// per op, blacklist failed programs, plan hot keys, and the online guard's part.
#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include "backend/runtime.h"
#include "backend/segment_work.h"
#include "engine/adaptive_guard.h"
#include "engine/guard_memory.h"
#include "engine/adaptive_registry.h"
#include "engine/compiled_region.h"
#include "engine/native_config.h"
#include "engine/recording.h"
#include "engine/stream_state.h"
#include "trace/log.h"
#include "trace/op_registry.h"
#include "trace/recorder.h"
#include "trace/segmenter.h"

namespace neuron::engine {
namespace {

void emit(trace::EventKind kind, uint64_t key, uint64_t aux, uint64_t duration, uint8_t core) {
  if (trace::recording()) trace::Recorder::instance().emit_ended(kind, key, aux, duration, core);
}

// Whether any tier-2 group of the program satisfies `pred`.
template <typename Pred>
bool any_group(const ReadyProgram& p, Pred pred) {
  for (const auto& n : p.natives)
    if (n && pred(*n)) return true;
  return false;
}

bool has_tier2_kernel(const ReadyProgram& p) {
  return any_group(p, [](backend::NativeGroup& n) { return n.state() == backend::NativeGroup::kAccepted; });
}
// Whether a fused group of the program runs its tier-2 trial (both tiers per run): guard
// samples of such runs would judge the trial, not the program.
bool on_native_trial(const ReadyProgram& p) {
  return any_group(p, [](backend::NativeGroup& n) { return n.on_native_trial(); });
}
// Whether a group's cost gate still counts tier-1 runs before it may ask for a kernel: the
// guard then tries the program a little longer (a few fused runs) instead of demoting it
// on tier 1's figures alone.
bool tier2_needs_runs(const ReadyProgram& p) {
  return any_group(p, [](backend::NativeGroup& n) { return n.tier2_needs_runs(); });
}
bool tier2_arrived(const ReadyProgram& p) {
  return any_group(p, [](backend::NativeGroup& n) { return n.tier2_arrived(); });
}

// The guard's part of a cut of a key that has a program: time a trial occurrence, take a
// verdict, pick the next occurrence's mode, start re-trials that are due.
void guard_at_cut(StreamState& state, ReadyProgram& ready,
                  const std::shared_ptr<fusion::KeyGuard>& guard_ptr, bool ran_fused,
                  uint64_t count, c10::DeviceIndex core, int64_t stream) {
  fusion::KeyGuard& guard = *guard_ptr;
  const uint8_t core8 = static_cast<uint8_t>(core);
  // The guard counts its own occurrences: a family's, every member's.
  count = ready.guard_seen ? ready.guard_seen->fetch_add(1, std::memory_order_relaxed) + 1 : count;
  if (ready.family_guard) {
    // Another member of the family may have ended the trial or started a re-trial:
    // this key follows (its occurrence now was planned under the old state: no sample).
    const bool family_on_trial = guard.on_trial();
    if (ready.on_trial.load() != family_on_trial) {
      ready.on_trial = family_on_trial;
      ready.per_op = guard.next_mode() == fusion::RunMode::kPerOp;
      trace_cache().transition(ready.key, family_on_trial      ? trace::SegmentState::kOnTrial
                                          : ready.per_op.load() ? trace::SegmentState::kDemoted
                                          : has_tier2_kernel(ready) ? trace::SegmentState::kReadyTier2
                                                                    : trace::SegmentState::kReadyTier1);
      return;
    }
  }
  if (ready.on_trial.load()) {
    // A fused run during a tier-2 trial is no sample: the guard's trial waits (the key
    // keeps running fused: the tier-2 trial needs fused runs, a few at most).
    if (ran_fused && on_native_trial(ready)) return;
    const int64_t occurrence = guard.end_occurrence();
    if (occurrence >= 0 && state.trial_span)
      queue_trial_end(backend::stream(core, stream), std::move(state.trial_span),
                      guard_ptr, occurrence,
                      ran_fused ? fusion::RunMode::kFused : fusion::RunMode::kPerOp);
    else if (occurrence >= 0)
      guard.discard(occurrence);  // not timed (the trial began at this cut)
    const fusion::GuardReport report = guard.poll(count);
    if (report.verdict == fusion::GuardVerdict::kNone) {
      ready.per_op = guard.next_mode() == fusion::RunMode::kPerOp;
      return;
    }
    const bool keep = report.verdict == fusion::GuardVerdict::kKeep;
    // (A family's trial starts over twice at most: its fused runs are spread over its
    // members, whose gates may each wait long for theirs.)
    if (!keep && tier2_needs_runs(ready) && (!ready.family_guard || report.trial < 3)) {
      // Judged on tier 1 before its groups' cost gates had their runs: the trial starts
      // over, giving them the few fused runs a build request waits for.
      guard.start_trial();
      ready.per_op = guard.next_mode() == fusion::RunMode::kPerOp;
      return;
    }
    ready.on_trial = false;
    ready.per_op = !keep;
    count_guard_verdict(report.verdict);
    emit_guard_verdict(ready.key, report, core8);
    remember_verdict(guard, active_policy().guard, report);
    trace_cache().transition(ready.key, !keep ? trace::SegmentState::kDemoted
                                        : has_tier2_kernel(ready) ? trace::SegmentState::kReadyTier2
                                                                  : trace::SegmentState::kReadyTier1);
    return;
  }
  // A key demoted on tier 1 is re-tried at once when a kernel of its arrives (once).
  const bool tier2_came = ready.per_op.load() && !ready.tier2_retried.load() && tier2_arrived(ready);
  if (tier2_came) ready.tier2_retried = true;
  if (ready.per_op.load() && (tier2_came || guard.retry_due(count))) {
    guard.start_trial();
    ready.on_trial = true;
    ready.per_op = guard.next_mode() == fusion::RunMode::kPerOp;
    count_guard_trial(true);
    trace_cache().transition(ready.key, trace::SegmentState::kOnTrial);
  } else if (!ready.per_op.load() && !ready.tier2_noted.load() && has_tier2_kernel(ready)) {
    ready.tier2_noted = true;
    trace_cache().transition(ready.key, trace::SegmentState::kReadyTier2);
  }
}

// Settling (Policy::settle_cuts): enough cuts in a row with nothing for fusion to do
// start a stretch of ops that pass unrecorded; a productive cut starts over.
void settle_after_cut(StreamState& state, bool productive) {
  const uint32_t cuts = active_settle_cuts();
  // (Never inside a stream trial: its recorded stretches must be recorded throughout.)
  if (productive || cuts == 0 || trace::recording() || any_compiled_region() ||
      state.stream_guard.on_trial()) {
    state.idle_cuts = 0;
    state.settle_round = 0;
    return;
  }
  if (++state.idle_cuts < cuts) return;
  state.idle_cuts = 0;
  state.settled_ops = active_settle_stretch(state.settle_round);
  state.settle_round += 1;
  ++g_settles;
}

}  // namespace

void adaptive_cut(StreamState& state, const trace::Segment& segment, uint64_t count,
                  c10::DeviceIndex core, int64_t stream, bool partial) {
  Registry& r = registry();
  const uint8_t core8 = static_cast<uint8_t>(core);
  std::shared_ptr<ReadyProgram> ready;
  std::shared_ptr<fusion::KeyGuard> guard;  // changed only under r.mutex
  {
    std::lock_guard lock(r.mutex);
    auto it = r.ready.find(segment.key);
    if (it != r.ready.end()) {
      ready = it->second;
      guard = ready->guard;
    }
  }
  // A program whose fused groups failed is blacklisted: its key runs per op from now on.
  if (ready && ready->failures->load() > 0) {
    std::lock_guard lock(r.mutex);
    r.ready.erase(segment.key);
    auto& list = r.by_first_signature[ready->signatures.front()];
    std::erase(list, ready);
    r.rejected.insert(segment.key);
    ready->on_trial = false;
    ++g_blacklisted;
    ++g_failures;
    trace_cache().transition(segment.key, trace::SegmentState::kBlacklisted);
    fallback_event("a fused group failed: segment blacklisted, its ops run per op", core8);
    ready.reset();
  }
  if (ready) note_prefix(*ready, true, segment.length);
  // Candidates still held for that were not this key: their prefix went on differently.
  for (const auto& c : state.candidates)
    if (c->key != segment.key) note_prefix(*c, false, segment.length);
  const uint32_t released = state.released, released_extern = state.released_extern;
  state.released = 0;
  state.released_extern = 0;
  const bool full_match = state.holding && ready && ready->words == segment.words &&
                          state.window.size() + released == segment.length &&
                          ready->signatures.size() == segment.length &&
                          // ops queued before the cut end at a step boundary of this program
                          (released == 0 || released == segment.length ||
                           ready->step_of_op[released] != ready->step_of_op[released - 1]) &&
                          fusion_allowed();
  if (trace::log_enabled(trace::LogLevel::kDebug)) {
    std::string names;
    for (auto& w : state.window) names += " " + trace::OpRegistry::instance().name(w->record.op);
    trace::log(trace::LogLevel::kDebug,
               "cut key=" + std::to_string(segment.key) + " len=" + std::to_string(segment.length) +
                   " holding=" + std::to_string(state.holding) + " ready=" + std::to_string(ready != nullptr) +
                   " full=" + std::to_string(full_match) + " window:" + names);
  }
  if (full_match) {
    auto work = std::make_unique<backend::SegmentWork>();
    work->program = ready->program;
    work->ops.resize(segment.length);
    for (size_t k = 0; k < state.window.size(); ++k) work->ops[released + k] = std::move(state.window[k]);
    work->key = segment.key;
    work->seq = segment.first_seq;
    work->core = core8;
    work->stream = static_cast<uint16_t>(stream);
    work->failures = ready->failures;
    work->natives = ready->natives;
    g_segments_fused += 1;
    g_ops_fused_segments += segment.length;  // released ops ran as its program said
    g_ops_per_op -= released_extern;
    for (const auto& step : ready->program->steps)
      if (step.kind != fusion::Step::kExtern && step.first >= released) g_ops_tile_groups += step.count;
    state.window.clear();
    state.held_bytes = 0;
    if (state.holding) g_open_windows.fetch_sub(1);
    state.holding = false;
    state.candidates.clear();
    backend::stream(core, stream).enqueue(std::move(work));
  } else if (!state.window.empty() || state.holding) {
    if (state.holding && !state.window.empty()) {
      ++g_divergences;
      fallback_event("segment ended before matching a ready program: held ops run per op", core8);
    }
    enqueue_per_op(state, core, stream);
  }
  if (ready && guard) guard_at_cut(state, *ready, guard, full_match, count, core, stream);
  state.trial_span.reset();
  // Whether this cut gave fusion anything to do: a fused run, a key on trial, or a key
  // recurring towards hotness (a new program below counts too).
  bool productive = full_match || (ready && ready->on_trial.load()) ||
                    (!ready && count >= 2 && count < active_hot_threshold());

  // Hot keys without a program get one now (tier 1 is planned in microseconds).
  // A compiled region's segments recur by construction: they compile at first sight, up
  // to the policy's bound per graph (a graph with dynamic shapes sees a key per shape).
  const bool first_sight = count < active_hot_threshold() &&
                           first_sight_compiles(active_region_max_programs());
  const uint64_t hot = first_sight ? 1 : active_hot_threshold();
  if (!ready && !partial && fusion_allowed() && count >= hot &&
      state.plan.size() == segment.length) {
    fusion::Policy policy = active_policy();
    // max-autotune: the program runs fused from its first run, no trial against per-op
    // runs, and its groups ask for tier 2 at once (a policy that keeps tier 1 only still
    // does); tier-2 kernels are still verified and kept only where faster than tier 1.
    const bool autotune = region_autotunes();
    if (autotune && policy.tier == fusion::Tier::kAuto) policy.tier = fusion::Tier::kNative;
    bool known;
    {
      std::lock_guard lock(r.mutex);
      known = r.ready.count(segment.key) || r.rejected.count(segment.key);
    }
    if (!known) {
      const auto start = std::chrono::steady_clock::now();
      auto program = std::make_shared<fusion::Program>(fusion::plan(state.plan, policy.min_fusible_ops,
                                                                         policy.min_group_elements,
                                                                         policy.hold_bytes));
      program->tile_bytes = static_cast<int64_t>(policy.tile_bytes);
      const auto took = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                  std::chrono::steady_clock::now() - start)
                                                  .count());
      std::lock_guard lock(r.mutex);
      // Even without a tile group, one work item for the whole segment saves a queue
      // hand-off per op; tile groups save memory traffic on top.
      if (segment.length >= 2 && policy.should_compile(segment.length, fusion::Tier::kInstant)) {
        auto rp = std::make_shared<ReadyProgram>();
        rp->key = segment.key;
        rp->words = segment.words;
        rp->program = program;
        {
          if (policy.tier != fusion::Tier::kInstant) configure_native_once();
          for (const auto& step : program->steps)
            rp->natives.push_back(step.kind != fusion::Step::kExtern
                                      ? std::make_shared<backend::NativeGroup>(policy, segment.key)
                                      : nullptr);
        }
        for (uint32_t st = 0; st < program->steps.size(); ++st)
          for (uint32_t k = 0; k < program->steps[st].count; ++k) rp->step_of_op.push_back(st);
        // Signatures of the segment's ops, in order.
        rp->signatures = trace::op_signatures(segment.words, segment.length);
        rp->family = segment.family;
        if (policy.guard.enabled && !autotune && attach_guard(r, *rp, policy.guard)) count_guard_trial(false);
        if (first_sight) note_first_sight_program(policy.region_max_programs);
        r.ready[segment.key] = rp;
        productive = true;
        r.by_first_signature[rp->signatures.front()].push_back(rp);
        ++g_programs;
        trace_cache().transition(segment.key, rp->on_trial.load() ? trace::SegmentState::kOnTrial
                                              : rp->per_op.load()  ? trace::SegmentState::kDemoted
                                                                   : trace::SegmentState::kReadyTier1);
        emit(trace::EventKind::kCompileStart, segment.key, 1, 0, core8);
        emit(trace::EventKind::kCompileEnd, segment.key, 1, took, core8);
      } else {
        r.rejected.insert(segment.key);
        trace_cache().transition(segment.key, trace::SegmentState::kBlacklisted);
        fallback_event(segment.length < 2 ? "hot segment of a single op"
                                          : "hot segment fails the cost gate (policy)",
                       core8);
      }
    }
  }
  state.plan.clear();
  if (!partial) settle_after_cut(state, productive);
}

}  // namespace neuron::engine
