// The adaptive controller's window: a segment's ops are held while they match a prefix of
// a ready program; extern steps and complete scratch-free groups go ahead of the cut.
#include <algorithm>
#include <memory>
#include <mutex>

#include "backend/runtime.h"
#include "backend/segment_work.h"
#include "engine/adaptive_guard.h"
#include "engine/adaptive_registry.h"
#include "engine/stream_state.h"

namespace neuron::engine {

void enqueue_per_op(StreamState& state, c10::DeviceIndex core, int64_t stream) {
  backend::Stream& s = backend::stream(core, stream);
  g_ops_per_op += state.window.size();
  for (auto& w : state.window) s.enqueue(std::move(w));
  state.window.clear();
  if (state.holding) g_open_windows.fetch_sub(1);
  state.holding = false;
  state.candidates.clear();
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
    std::erase_if(state.candidates, [&](const std::shared_ptr<ReadyProgram>& c) {
      const bool differs = c->signatures.size() <= position || c->signatures[position] != signature;
      if (differs) note_prefix(*c, false, position);
      return differs;
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
    const bool differs = words.size() > c->words.size() ||
                         !std::equal(words.begin(), words.end(), c->words.begin());
    if (differs) note_prefix(*c, false, position + 1);
    return differs;
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

}  // namespace neuron::engine
