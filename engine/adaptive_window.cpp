// The adaptive controller's window: a segment's ops are held while they match a prefix of
// a ready program; extern steps and complete scratch-free groups go ahead of the cut.
#include <algorithm>
#include <memory>
#include <mutex>

#include "backend/runtime.h"
#include "backend/segment_work.h"
#include "engine/adaptive_guard.h"
#include "engine/adaptive_registry.h"
#include "engine/recording.h"
#include "engine/stream_state.h"

namespace neuron::engine {

void enqueue_per_op(StreamState& state, c10::DeviceIndex core, int64_t stream) {
  backend::Stream& s = backend::stream(core, stream);
  g_ops_per_op += state.window.size();
  for (auto& w : state.window) s.enqueue(std::move(w));
  state.window.clear();
  state.held_bytes = 0;
  if (state.holding) g_open_windows.fetch_sub(1);
  state.holding = false;
  state.candidates.clear();
  // Everything held is queued now: later work on the stream runs after it.
  state.unpin_before(static_cast<uint32_t>(state.pin_ends.size()));
}

namespace {

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

// Whether every value the step keeps in scratch (never written to device memory) is
// dead now: nothing references its tensor and no view of its storage was taken.
bool scratch_dead(const StreamState& state, const fusion::Step& step) {
  size_t index = 0;  // the step's first output among the open segment's outputs
  for (uint32_t q = 0; q < step.first; ++q) index += state.plan[q].outputs.size();
  for (uint32_t k = 0; k < step.count; ++k) {
    const fusion::PlanOp& op = state.plan[step.first + k];
    const std::vector<bool>& scratch = step.scratch[k];
    for (size_t o = 0; o < op.outputs.size(); ++o, ++index) {
      if (o >= scratch.size() || !scratch[o]) continue;
      if (index >= state.outputs.size() || state.outputs[index].use_count() > 0) return false;
      const auto id = static_cast<uint64_t>(op.outputs[o]);
      if (std::find(state.viewed.begin(), state.viewed.end(), id) != state.viewed.end()) return false;
    }
  }
  return true;
}

// Drops the candidates `differs` names (each notes the prefix it held up to `position`).
// When none is left, the held ops run per op, counted as a divergence with `reason`.
// Returns whether a candidate is left.
template <typename Differs>
bool keep_matching_candidates(StreamState& state, c10::DeviceIndex core, int64_t stream, uint32_t position,
                              Differs differs, const char* reason) {
  std::erase_if(state.candidates, [&](const std::shared_ptr<ReadyProgram>& c) {
    const bool gone = differs(*c);
    if (gone) note_prefix(*c, false, position);
    return gone;
  });
  if (!state.candidates.empty()) return true;
  ++g_divergences;
  fallback_event(reason, static_cast<uint8_t>(core));
  enqueue_per_op(state, core, stream);
  return false;
}

}  // namespace

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
        // A key sharing its family's trial runs in the mode the trial plans next: the
        // family's last occurrence may have been another member's.
        if (c->family_guard && c->on_trial.load(std::memory_order_relaxed))
          c->per_op = c->guard->next_mode() == fusion::RunMode::kPerOp;
        if (c->per_op.load(std::memory_order_relaxed)) return true;
        if (holds_prefix(*c)) return false;
        ++g_prefix_skips;  // its prefix mostly goes on differently: not worth the delay
        return true;
      });
    }
    if (!state.candidates.empty() && !state.holding) {
      state.holding = true;
      g_open_windows.fetch_add(1);
    }
  } else if (state.holding) {
    keep_matching_candidates(
        state, core, stream, position,
        [&](const ReadyProgram& c) { return c.signatures.size() <= position || c.signatures[position] != signature; },
        "diverged from every ready segment: held ops run per op");
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
  state.held_bytes += state.plan.back().out_bytes;
  state.window.push_back(std::move(work));
}

void adaptive_after_add(StreamState& state, c10::DeviceIndex core, int64_t stream) {
  if (!state.holding || state.window.empty() || !fusion_allowed()) return;
  const uint32_t position = state.segmenter.open_length() - 1;
  if (state.plan.size() != position + 1) return;
  bool words_checked = false;
  // Steps at the front of the window that every candidate ends where it does go ahead of
  // the cut: extern ops per op, tile and foreach groups once complete and the values they
  // keep in scratch are dead (a dead value stays dead, so the cut would find the same).
  while (state.holding && !state.window.empty()) {
    const std::shared_ptr<ReadyProgram> lead = state.candidates.front();
    const uint32_t first = state.released;
    if (first >= lead->step_of_op.size()) break;
    const fusion::Step& step = lead->program->steps[lead->step_of_op[first]];
    const uint32_t last = step.first + step.count - 1;
    if (step.first != first || last > position || state.window.size() < step.count ||
        !all_candidates_end_step(state, first, last, step.kind))
      break;
    if (step.kind == fusion::Step::kExtern) {
      state.held_bytes -= state.plan[first].out_bytes;
      backend::stream(core, stream).enqueue(std::move(state.window.front()));
      state.window.erase(state.window.begin());
      ++state.released;
      ++state.released_extern;
      ++g_ops_per_op;
      continue;
    }
    if (!scratch_dead(state, step)) break;
    if (!words_checked) {
      // Candidates whose words differ from the ops so far can never match: drop them.
      const std::vector<int64_t> words = state.segmenter.open_op_words();
      if (!keep_matching_candidates(
              state, core, stream, position + 1,
              [&](const ReadyProgram& c) {
                return words.size() > c.words.size() || !std::equal(words.begin(), words.end(), c.words.begin());
              },
              "dataflow differs from every ready segment: held ops run per op"))
        return;
      words_checked = true;
      if (state.candidates.front() != lead) break;  // the plan to follow changed: wait for the cut
    }
    auto work = std::make_unique<backend::SegmentWork>();
    work->program = lead->program;
    work->ops.resize(last + 1);
    for (uint32_t k = 0; k < step.count; ++k) {
      state.held_bytes -= state.plan[first + k].out_bytes;
      work->ops[first + k] = std::move(state.window[k]);
    }
    state.window.erase(state.window.begin(), state.window.begin() + step.count);
    work->key = lead->key;
    work->seq = work->ops[first]->seq;  // traced: a SegmentExecute of this group's ops
    work->core = static_cast<uint8_t>(core);
    work->stream = static_cast<uint16_t>(stream);
    work->failures = lead->failures;
    work->natives = lead->natives;
    state.released = last + 1;
    g_ops_tile_groups += step.count;
    backend::stream(core, stream).enqueue(std::move(work));
  }
  if (!state.holding) return;
  state.unpin_before(state.released);
  // A window that keeps more than twice hold_bytes of outputs (a complete group waiting
  // for its scratch values to die, and the ops after it) runs per op: memory must not
  // grow with how far the host runs ahead.
  const uint64_t bound = active_hold_bytes();
  if (bound != 0 && static_cast<uint64_t>(std::max<int64_t>(state.held_bytes, 0)) > 2 * bound) {
    ++g_hold_overflows;
    fallback_event("held ops keep more than twice the policy's hold_bytes: they run per op",
                   static_cast<uint8_t>(core));
    enqueue_per_op(state, core, stream);
  }
}

}  // namespace neuron::engine
