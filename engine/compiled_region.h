// Compiled regions: the ops of a graph torch.compile(backend="neuron") captured. Their
// segments start and end at the graph's edges, are fused in any mode, and get a program
// at their first sighting (the graph is known to recur; nothing waits for hot_threshold).
#pragma once

#include <atomic>
#include <cstdint>

namespace neuron::engine {

// Entered and left by the calling thread around one run of a compiled graph; both cut
// the open segments of the current core. Regions nest.
void enter_compiled_region();
void exit_compiled_region();
// Some thread is inside a compiled region: ops are observed and segments may fuse.
bool any_compiled_region();
// The calling thread is inside a compiled region: its segments compile at first sight.
bool in_compiled_region();
// Runs of compiled graphs so far (the counter compiled_region_runs).
uint64_t compiled_region_runs();

}  // namespace neuron::engine
