// What the engine tells the trace layer: op dispatches, syncs with their cause, ops run
// synchronously, and the segments and keys of the op stream. Everything is a no-op
// (one relaxed load) unless a trace is recording or adaptive mode needs the segments.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/op_table.h"
#include "engine/pch.h"
#include "fusion/policy.h"
#include "trace/recorder.h"
#include "trace/trace_cache.h"

namespace neuron::backend {
class OpWork;
}

namespace neuron::engine {

// Whether ops feed the segmenter (tracing on, or adaptive mode).
bool observing();
uint64_t next_seq();
// Before an op is queued: emits its dispatch event and feeds the segmenter. In adaptive
// mode the controller takes the work (queues it, holds it in the window while it matches
// a ready segment, or launches the fused segment) and work is left empty.
// Whether the op about to be noted on (core, stream) passes unrecorded: the stream is
// settled (Policy::settle_cuts) and neither a trace nor a compiled region needs its ops.
// The caller then queues the op as in eager mode.
bool settled_op(c10::DeviceIndex core, int64_t stream);
void note_dispatch(std::unique_ptr<backend::OpWork>& work, const OpInfo& info,
                   c10::DeviceIndex core, int64_t stream, uint64_t start_ns,
                   const std::vector<at::Tensor>& fresh_outputs);
// Closes the open segments of a core and queues whatever the window holds: needed before
// anything else is queued or waited for on that core.
void flush_windows(c10::DeviceIndex core);
// The same, with the cut's reason (a collective cuts as a barrier: no segment spans it).
void flush_windows(c10::DeviceIndex core, trace::CutReason reason);
void flush_all_windows();
// Forgets every segment key, program and decision (like torch._dynamo.reset()): the next
// occurrences start cold. Waits for queued work and background builds first.
void reset_fusion_state();
void note_synchronous_op(const OpInfo& info);

// Marks a host wait: closes open segments of the core and emits a Sync event on exit.
class SyncScope {
 public:
  SyncScope(c10::DeviceIndex core, const char* cause);
  ~SyncScope();

 private:
  c10::DeviceIndex core_;
  const char* cause_;
  uint64_t start_ns_ = 0;
};

// Starts/stops trace recording (metadata: mode, policy, versions).
// user_json: a JSON object from the caller, merged into the metadata (may be empty).
void start_trace(const std::string& path, const std::string& user_json = "");
uint64_t stop_trace();
trace::TraceCache& trace_cache();
// The fusion policy in force (segmenting knobs apply to new segments at once).
fusion::Policy active_policy();
// Cheap reads of the active policy for the per-op and per-cut paths (no copy, no lock).
bool active_policy_lifts();        // the policy lifts scalars out of op signatures
bool active_policy_lists_ops();    // the policy names its own fusible_ops
uint64_t active_hot_threshold();
uint32_t active_region_max_programs();
// The policy's queue_max_ops: the backpressure bound on items queued per stream.
int64_t active_queue_max_ops();
// The policy's hold_min_missed_ops and hold_miss_ratio (when a ready program stops holding).
uint32_t active_hold_min_missed_ops();
double active_hold_miss_ratio();
// The policy's settle_cuts, and the ops of a stream's round-th settled stretch in a row.
// The policy's hold_bytes (bytes of fresh outputs held ops may keep; 0: no bound).
uint64_t active_hold_bytes();
uint32_t active_settle_cuts();
uint32_t active_settle_stretch(uint32_t round);
void set_active_policy(const fusion::Policy& policy);
// Set by the bindings: the Python stack of the calling thread, or "" outside Python.
void set_stack_capture(std::string (*capture)());

}  // namespace neuron::engine
