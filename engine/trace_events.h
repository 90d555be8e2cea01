// Trace events of the op stream (recording.cpp emits them while a trace records): an op's
// dispatch with its dataflow links, a segment's cut and key, what replay needs beyond the
// cuts, memory and queue depth, and ops run synchronously.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/op_table.h"
#include "engine/pch.h"
#include "trace/segmenter.h"
#include "trace/trace_cache.h"

namespace neuron::engine {

// Links op to the ops of its stream that produced its inputs, into links (the caller holds
// the stream's mutex).
void link_dataflow(c10::DeviceIndex core, int64_t stream, const trace::SegmentOp& op,
                   std::vector<uint32_t>& links);
// The op's OpDispatch event, its dataflow events and, for matmul-class ops, its FLOPs.
void emit_op_dispatch(const backend::OpWork& work, const OpInfo& info, const trace::SegmentOp& op,
                      c10::DeviceIndex core, int64_t stream, uint64_t start_ns,
                      const std::vector<uint32_t>& links);
// The SegmentCut and KeyHit/KeyMiss events of a closed segment, then the core's counters.
void emit_segment_cut(const trace::Segment& s, trace::TraceCache::Lookup lookup, uint64_t count,
                      c10::DeviceIndex core, int64_t stream, uint64_t now);
// The dead outputs of a closed segment (s may be null) and, for a sync or barrier, a
// StreamFlush of the ops seen so far.
void emit_replay_cut(c10::DeviceIndex core, int64_t stream, trace::CutReason reason,
                     const trace::Segment* s, const std::vector<bool>& alive);
// Memory and QueueDepth events of a core (no-op unless recording).
void emit_counters(c10::DeviceIndex core, uint64_t now);
// The Fallback event of an op that runs synchronously.
void emit_synchronous_op(const OpInfo& info, c10::DeviceIndex core);
// Dataflow links start afresh (each recording).
void restart_dataflow_links();

}  // namespace neuron::engine
