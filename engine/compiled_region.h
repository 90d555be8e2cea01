// Compiled regions: the ops of a graph torch.compile(backend="neuron") captured. Their
// segments start and end at the graph's edges, are fused in any mode, and get a program
// at their first sighting (the graph is known to recur; nothing waits for hot_threshold).
#pragma once

#include <atomic>
#include <cstdint>

namespace neuron::engine {

// Entered and left by the calling thread around one run of a compiled graph (graph: its
// id, one per graph the backend compiled); both cut the open segments of the current
// core. Regions nest (the outermost graph counts). autotune (torch.compile's
// mode="max-autotune"): the graph's groups ask for tier-2 kernels at their first run,
// skipping tier 2's cost gate.
void enter_compiled_region(uint64_t graph, bool autotune = false);
void exit_compiled_region();
// Some thread is inside a compiled region: ops are observed and segments may fuse.
bool any_compiled_region();
// The calling thread is inside a compiled region whose graph has had fewer than
// max_programs keys compiled at first sight: its segments compile at first sight.
bool first_sight_compiles(uint32_t max_programs);
// A program was made for a key at first sight inside the calling thread's region.
void note_first_sight_program(uint32_t max_programs);
// Forgets the per-graph counts (reset_fusion_state: every program is forgotten too).
void forget_first_sight_programs();
// The calling thread is inside a compiled region that autotunes.
bool region_autotunes();
// Runs of compiled graphs so far (the counter compiled_region_runs).
uint64_t compiled_region_runs();

}  // namespace neuron::engine
