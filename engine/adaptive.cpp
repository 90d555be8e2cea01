// The adaptive controller: hot segment keys get a fused program (tier 1, planned in
// microseconds); ops that match a prefix of a ready program wait in the window; a full
// match launches the segment as one work item, anything else runs per op. Correctness
// never depends on a decision here: every path produces the per-op results.
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "backend/native_group.h"
#include "backend/runtime.h"
#include "backend/segment_work.h"
#include "engine/adaptive_guard.h"
#include "engine/engine.h"
#include "engine/recording.h"
#include "engine/stream_state.h"
#include "fusion/native.h"
#include "trace/log.h"
#include "trace/op_registry.h"
#include "trace/recorder.h"
#include "trace/segmenter.h"

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
  std::atomic<bool> on_trial{false};
  std::atomic<bool> per_op{false};
  std::atomic<bool> tier2_noted{false};
};

namespace {

struct Registry {
  std::mutex mutex;
  std::unordered_map<uint64_t, std::shared_ptr<ReadyProgram>> ready;
  std::unordered_map<uint64_t, std::vector<std::shared_ptr<ReadyProgram>>> by_first_signature;
  std::unordered_set<uint64_t> rejected;  // keys not worth fusing, or blacklisted
};

Registry& registry() {
  static auto* r = new Registry();
  return *r;
}

std::atomic<uint64_t> g_programs{0}, g_segments_fused{0}, g_ops_fused_segments{0},
    g_ops_tile_groups{0}, g_ops_per_op{0}, g_divergences{0}, g_blacklisted{0}, g_failures{0};
std::atomic<int> g_open_windows{0};

void emit(trace::EventKind kind, uint64_t key, uint64_t aux, uint64_t duration, uint8_t core) {
  if (!trace::recording()) return;
  auto& rec = trace::Recorder::instance();
  trace::Event e;
  e.time_ns = rec.now_ns() - duration;
  e.duration_ns = duration;
  e.kind = static_cast<uint8_t>(kind);
  e.value = key;
  e.aux = aux;
  e.core = core;
  rec.emit(e);
}

void fallback_event(const char* reason, uint8_t core) {
  if (!trace::recording()) return;
  auto& rec = trace::Recorder::instance();
  trace::Event e;
  e.time_ns = rec.now_ns();
  e.kind = static_cast<uint8_t>(trace::EventKind::kFallback);
  e.value = rec.intern_string(reason);
  e.core = core;
  rec.emit(e);
}

void enqueue_per_op(StreamState& state, c10::DeviceIndex core, int64_t stream) {
  backend::Stream& s = backend::stream(core, stream);
  g_ops_per_op += state.window.size();
  for (auto& w : state.window) s.enqueue(std::move(w));
  state.window.clear();
  if (state.holding) g_open_windows.fetch_sub(1);
  state.holding = false;
  state.candidates.clear();
}

// Tier 2's compiler setup, once: the compiler (NEURON_CXX), ATen's own ISA flags (so the
// generated kernels evaluate what ATen's kernels evaluate), torch's headers, the cache.
void configure_native_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    fusion::NativeOptions o;
    const Config& c = config();
    o.compiler = c.cxx.empty() ? "c++" : c.cxx;
    o.cache_dir = c.cache_dir;
    if (o.cache_dir.empty()) {
      const char* xdg = std::getenv("XDG_CACHE_HOME");
      const char* home = std::getenv("HOME");
      if (xdg != nullptr && *xdg) o.cache_dir = std::string(xdg) + "/neuron-eager";
      else if (home != nullptr && *home) o.cache_dir = std::string(home) + "/.cache/neuron-eager";
    }
    std::string include, lib_dir;
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&at::get_num_threads), &info) != 0 && info.dli_fname) {
      const std::string lib = info.dli_fname;  // .../torch/lib/libtorch_cpu.so
      lib_dir = lib.substr(0, lib.rfind('/'));
      include = lib_dir + "/../include";
    }
    // ATen's vector math (Sleef) lives in libtorch_cpu.
    o.link_flags = {"-L" + lib_dir, "-Wl,--no-as-needed", "-ltorch_cpu", "-Wl,-rpath," + lib_dir};
    o.flags = {"-O2", "-std=gnu++17", "-w", "-fno-math-errno", "-fno-trapping-math",
               "-D_GLIBCXX_USE_CXX11_ABI=" + std::to_string(_GLIBCXX_USE_CXX11_ABI),
               "-isystem", include};
    const std::string isa = at::get_cpu_capability();  // what ATen's kernels were picked for
    if (isa == "AVX2")
      o.flags.insert(o.flags.end(), {"-mavx2", "-mfma", "-mbmi", "-mbmi2", "-mf16c",
                                     "-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"});
    else if (isa == "AVX512")
      o.flags.insert(o.flags.end(), {"-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq",
                                     "-mfma", "-mf16c", "-DCPU_CAPABILITY=AVX512",
                                     "-DCPU_CAPABILITY_AVX512"});
    else
      o.flags.insert(o.flags.end(), {"-DCPU_CAPABILITY=DEFAULT", "-DCPU_CAPABILITY_DEFAULT"});
    o.version = std::string("neuron-eager ") + NEURON_VERSION + " torch " + NEURON_TORCH_VERSION +
                " codegen 2";
    fusion::NativeCompiler::instance().configure(std::move(o));
  });
}

bool fusion_allowed() {
  return mode() == Mode::kAdaptive && !at::globalContext().deterministicAlgorithms();
}

}  // namespace

bool any_window_open() { return g_open_windows.load(std::memory_order_relaxed) > 0; }


// Whether every remaining candidate has a step of kind `kind` that covers ops
// [first, position] and ends at position: only then may those ops go ahead of the cut.
// (Programs that start alike can group their first ops differently; launching by one of
// them and matching another at the cut would leave a group split across the boundary.)
bool all_candidates_end_step(const StreamState& state, uint32_t first, uint32_t position,
                             fusion::Step::Kind kind) {
  for (const auto& c : state.candidates) {
    if (position >= c->step_of_op.size()) return false;
    const fusion::Step& step = c->program->steps[c->step_of_op[position]];
    if (step.kind != kind || step.first != first || step.first + step.count - 1 != position) return false;
  }
  return true;
}

void adaptive_take(StreamState& state, std::unique_ptr<backend::OpWork> work,
                   fusion::PlanOp plan_op, uint64_t signature, c10::DeviceIndex core,
                   int64_t stream) {
  const uint32_t position = state.segmenter.open_length();
  if (position == 0 && fusion_allowed()) {
    // A segment starts: hold its ops if some ready program starts the same way.
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    auto it = r.by_first_signature.find(signature);
    state.candidates.clear();
    state.trial_span.reset();
    if (it != r.by_first_signature.end()) {
      state.candidates = it->second;
      // A key on trial may be starting: time the occurrence from here.
      for (const auto& c : it->second)
        if (c->on_trial.load(std::memory_order_relaxed)) {
          state.trial_span = queue_trial_start(backend::stream(core, stream));
          break;
        }
      std::erase_if(state.candidates, [](const std::shared_ptr<ReadyProgram>& c) {
        return c->per_op.load(std::memory_order_relaxed);
      });
    }
    if (!state.candidates.empty() && !state.holding) {
      state.holding = true;
      g_open_windows.fetch_add(1);
    }
  } else if (state.holding) {
    std::erase_if(state.candidates, [&](const std::shared_ptr<ReadyProgram>& c) {
      return c->signatures.size() <= position || c->signatures[position] != signature;
    });
    if (state.candidates.empty()) {
      ++g_divergences;
      fallback_event("diverged from every ready segment: held ops run per op",
                     static_cast<uint8_t>(core));
      enqueue_per_op(state, core, stream);
    }
  }
  state.plan.push_back(std::move(plan_op));
  if (!state.holding) {
    ++g_ops_per_op;
    backend::stream(core, stream).enqueue(std::move(work));
    return;
  }
  // An extern step of the matching program with nothing held before it runs as it would
  // inside the fused segment: queue it now, so the worker never waits for the cut.
  const ReadyProgram& lead = *state.candidates.front();
  const fusion::Step& step = lead.program->steps[lead.step_of_op[position]];
  if (step.kind == fusion::Step::kExtern && state.window.empty() && state.released == position &&
      all_candidates_end_step(state, position, position, fusion::Step::kExtern)) {
    ++state.released;
    ++state.released_extern;
    ++g_ops_per_op;
    backend::stream(core, stream).enqueue(std::move(work));
    return;
  }
  state.window.push_back(std::move(work));
}

void adaptive_after_add(StreamState& state, c10::DeviceIndex core, int64_t stream) {
  if (!state.holding || state.window.empty() || !fusion_allowed()) return;
  const uint32_t position = state.segmenter.open_length() - 1;
  std::shared_ptr<ReadyProgram> lead = state.candidates.front();
  if (position >= lead->step_of_op.size()) return;
  const uint32_t index = lead->step_of_op[position];
  const fusion::Step& step = lead->program->steps[index];
  // A whole tile group, just completed, with nothing else held: launch it now unless it
  // keeps intermediates in scratch (whether they die is only known at the cut).
  if (step.kind == fusion::Step::kExtern || position != step.first + step.count - 1 ||
      state.released != step.first || state.window.size() != step.count ||
      !all_candidates_end_step(state, step.first, position, step.kind))
    return;
  for (const auto& per_op : step.scratch)
    for (bool s : per_op)
      if (s) return;
  // Candidates whose words differ from the ops so far can never match: drop them.
  const std::vector<int64_t> words = state.segmenter.open_op_words();
  std::erase_if(state.candidates, [&](const std::shared_ptr<ReadyProgram>& c) {
    return words.size() > c->words.size() || !std::equal(words.begin(), words.end(), c->words.begin());
  });
  if (state.candidates.empty()) {
    ++g_divergences;
    fallback_event("dataflow differs from every ready segment: held ops run per op", static_cast<uint8_t>(core));
    enqueue_per_op(state, core, stream);
    return;
  }
  if (state.candidates.front() != lead) return;  // the plan to follow changed: wait for the cut
  auto work = std::make_unique<backend::SegmentWork>();
  work->program = lead->program;
  work->ops.resize(position + 1);
  for (uint32_t k = 0; k < step.count; ++k) work->ops[step.first + k] = std::move(state.window[k]);
  work->key = lead->key;
  work->seq = work->ops[step.first]->seq;  // traced: a SegmentExecute of this group's ops
  work->core = static_cast<uint8_t>(core);
  work->stream = static_cast<uint16_t>(stream);
  work->failures = lead->failures;
  work->natives = lead->natives;
  state.window.clear();
  state.released = position + 1;
  g_ops_tile_groups += step.count;
  backend::stream(core, stream).enqueue(std::move(work));
}

namespace {

bool has_tier2_kernel(const ReadyProgram& p) {
  for (const auto& n : p.natives)
    if (n && n->state() == backend::NativeGroup::kAccepted) return true;
  return false;
}

// Whether a fused group of the program runs its tier-2 trial (both tiers per run): guard
// samples of such runs would judge the trial, not the program.
bool on_native_trial(const ReadyProgram& p) {
  for (const auto& n : p.natives)
    if (n && n->on_native_trial()) return true;
  return false;
}

// The guard's part of a cut of a key that has a program: time a trial occurrence, take a
// verdict, pick the next occurrence's mode, start re-trials that are due.
void guard_at_cut(StreamState& state, ReadyProgram& ready,
                  const std::shared_ptr<fusion::KeyGuard>& guard_ptr, bool ran_fused,
                  uint64_t count, c10::DeviceIndex core, int64_t stream) {
  fusion::KeyGuard& guard = *guard_ptr;
  const uint8_t core8 = static_cast<uint8_t>(core);
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
    ready.on_trial = false;
    ready.per_op = !keep;
    count_guard_verdict(report.verdict);
    emit_guard_verdict(ready.key, report, core8);
    trace_cache().transition(ready.key, !keep ? trace::SegmentState::kDemoted
                                        : has_tier2_kernel(ready) ? trace::SegmentState::kReadyTier2
                                                                  : trace::SegmentState::kReadyTier1);
    return;
  }
  if (ready.per_op.load() && guard.retry_due(count)) {
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

}  // namespace

void adaptive_cut(StreamState& state, const trace::Segment& segment, uint64_t count,
                  c10::DeviceIndex core, int64_t stream) {
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

  // Hot keys without a program get one now (tier 1 is planned in microseconds).
  if (!ready && fusion_allowed() && count >= active_hot_threshold() &&
      state.plan.size() == segment.length) {
    const fusion::Policy policy = active_policy();
    bool known;
    {
      std::lock_guard lock(r.mutex);
      known = r.ready.count(segment.key) || r.rejected.count(segment.key);
    }
    if (!known) {
      const auto start = std::chrono::steady_clock::now();
      auto program = std::make_shared<fusion::Program>(fusion::plan(state.plan, policy.min_fusible_ops,
                                                                         policy.min_group_elements));
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
        if (policy.guard.enabled) {
          rp->guard = std::make_shared<fusion::KeyGuard>(segment.key, policy.guard);
          rp->guard->start_trial();
          rp->on_trial = true;
          rp->per_op = rp->guard->next_mode() == fusion::RunMode::kPerOp;
          count_guard_trial(false);
        }
        r.ready[segment.key] = rp;
        r.by_first_signature[rp->signatures.front()].push_back(rp);
        ++g_programs;
        trace_cache().transition(segment.key, policy.guard.enabled ? trace::SegmentState::kOnTrial
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
}

void guard_policy_changed(const fusion::Policy& policy) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  for (auto& [key, rp] : r.ready) {
    if (!policy.guard.enabled) {  // no guard: every program runs fused
      rp->guard.reset();
      rp->on_trial = false;
      rp->per_op = false;
      continue;
    }
    if (rp->guard && (rp->on_trial.load() || !rp->per_op.load())) continue;
    // Demoted, or never guarded: a trial under the new settings, at once.
    const bool retrial = rp->guard != nullptr;
    rp->guard = std::make_shared<fusion::KeyGuard>(key, policy.guard);
    rp->guard->start_trial();
    rp->on_trial = true;
    rp->per_op = rp->guard->next_mode() == fusion::RunMode::kPerOp;
    count_guard_trial(retrial);
    trace_cache().transition(key, trace::SegmentState::kOnTrial);
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
  }
  trace_cache().clear();
}

void reset_adaptive_stats() {
  for (auto* c : {&g_programs, &g_segments_fused, &g_ops_fused_segments, &g_ops_tile_groups,
                  &g_ops_per_op, &g_divergences, &g_blacklisted, &g_failures})
    c->store(0);
  reset_guard_counters();
  backend::reset_native_counters();
  fusion::NativeCompiler::instance().reset_stats();
}

AdaptiveStats adaptive_stats() {
  AdaptiveStats s;
  s.programs = g_programs;
  s.segments_fused = g_segments_fused;
  s.ops_in_fused_segments = g_ops_fused_segments;
  s.ops_in_tile_groups = g_ops_tile_groups;
  s.ops_per_op = g_ops_per_op;
  s.divergences = g_divergences;
  s.blacklisted = g_blacklisted;
  s.failures = g_failures;
  return s;
}

}  // namespace neuron::engine
