// Per (core, stream) state shared by recording and the adaptive controller: the
// segmenter, weak references to the open segment's outputs (for liveness at the cut),
// and in adaptive mode the window of held ops and the plan of each op.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "backend/op_work.h"
#include "engine/op_table.h"
#include "engine/pch.h"
#include "fusion/planner.h"
#include "fusion/stream_guard.h"
#include "trace/segmenter.h"

namespace neuron::engine {

struct ReadyProgram;
struct TrialSpan;

struct StreamState {
  std::mutex mutex;
  trace::Segmenter segmenter;
  std::vector<c10::weak_intrusive_ptr<c10::TensorImpl>> outputs;  // open segment's outputs
  std::vector<fusion::PlanOp> plan;                  // per op of the open segment
  std::vector<std::unique_ptr<backend::OpWork>> window;  // held ops (a prefix of the segment)
  std::vector<std::shared_ptr<ReadyProgram>> candidates;  // ready programs still matching
  bool holding = false;
  // Ops of the open segment already queued while it matched (extern steps released at
  // once, scratch-free groups launched when complete): the window holds the ops after.
  uint32_t released = 0;
  uint32_t released_extern = 0;  // of those, single extern ops (counted per op until a match)
  std::vector<uint64_t> viewed;  // storages of open-segment outputs that views were taken of
  // Storages held ops touch stay alive until the ops are queued (they read them then):
  // pinned in op order, pin_ends[p] the end of the pins of the segment's op p (holding
  // starts at a segment's first op); pins before pin_dropped became identities already.
  std::vector<c10::Storage> pinned;
  std::vector<uint32_t> pin_ends;
  uint32_t pin_dropped = 0;
  int64_t held_bytes = 0;  // fresh-output bytes of the ops in the window
  // Storages it touched outside held ops: weak, so their memory is freed as in eager mode
  // while their StorageImpl (whose address is their identity) is not reused before the cut.
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> identities;
  // Buffers the cut reuses (it allocates nothing once they have grown).
  std::vector<bool> cut_alive;
  std::vector<uint64_t> cut_outputs;
  trace::Segment cut_segment;
  // The open segment's start marker, when a key on trial may be starting (adaptive_guard.h).
  std::shared_ptr<TrialSpan> trial_span;
  // Settling (Policy::settle_cuts): cuts in a row that fused nothing and had nothing to
  // decide, stretches settled in a row, and ops of this stretch still to pass unrecorded
  // (read without the lock by settled_op). stretch_open: the stretch has begun (the open
  // segment dropped, the segmenter started afresh). partial: the segmenter restarted at
  // an arbitrary op, so its first segment is a fragment: observed, never planned, and
  // neutral for settling.
  uint32_t idle_cuts = 0;
  uint32_t settle_round = 0;
  std::atomic<uint32_t> settled_ops{0};
  bool stretch_open = false;
  bool partial = false;
  // The stream trial (fusion/stream_guard.h); guard_stretch: the settled stretch running
  // now is one the trial asked for (its end goes back to the trial).
  fusion::StreamGuard stream_guard;
  bool guard_stretch = false;
  StreamState(trace::SegmentPolicy policy, fusion::StreamTrialSettings trial, uint64_t seed)
      : segmenter(std::move(policy)), stream_guard(trial, seed) {}
  // The ops before segment position `ops` are queued: their pins become identities (their
  // memory is freed as in eager mode once nothing else holds it; later work on the stream
  // runs after theirs). 
  void unpin_before(uint32_t ops);
  void clear_pins();
};

// The state of (core, stream), created on first use; nullptr-safe lookup for scans.
StreamState& stream_state(c10::DeviceIndex core, int64_t stream);
StreamState* find_stream_state(c10::DeviceIndex core, int64_t stream);
// Every state's segmenter starts afresh under the current policy (its open segment closed).
void restart_segmenters();
// The segmenting settings of the active policy (active_policy.cpp).
trace::SegmentPolicy current_segment_policy();
// The stream trial's settings under the active policy (active_policy.cpp).
fusion::StreamTrialSettings current_stream_trial();

// Adaptive controller (adaptive_window.cpp, adaptive_cut.cpp). The caller holds state.mutex.
// Takes one dispatched op: queue it, or hold it while it matches a ready program.
void adaptive_take(StreamState& state, std::unique_ptr<backend::OpWork> work,
                   fusion::PlanOp plan_op, uint64_t signature, c10::DeviceIndex core,
                   int64_t stream);
// After the segmenter took the op (no cut): a complete scratch-free group of the matching
// program is launched at once instead of waiting for the cut.
void adaptive_after_add(StreamState& state, c10::DeviceIndex core, int64_t stream);
// A segment closed: launch it fused, or queue held ops per op; compile hot keys.
// partial: the segment is the fragment after a restart of the segmenter (never planned).
void adaptive_cut(StreamState& state, const trace::Segment& segment, uint64_t count,
                  c10::DeviceIndex core, int64_t stream, bool partial);
// The stream trial's calls (stream_trial.cpp; the caller holds state.mutex): a recorded
// op was dispatched / the last op of a stretch the trial asked for passed unrecorded.
// Each returns the ops that should pass unrecorded next (0: record).
uint64_t stream_trial_recorded_op(StreamState& state, c10::DeviceIndex core);
uint64_t stream_trial_unrecorded_done(StreamState& state, c10::DeviceIndex core);
// A view of base was created: its storage stays observable even if base dies.
void note_view(const at::Tensor& base);
// How an op would take part in a fused program.
// May rewrite an op's dim argument to -1 (the same dim) where it joins row tiles.
fusion::PlanOp plan_op_of(backend::OpWork& work, const OpInfo& info);

}  // namespace neuron::engine
