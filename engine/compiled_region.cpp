#include "engine/compiled_region.h"

#include "engine/engine.h"
#include "engine/recording.h"
#include "trace/counters.h"

namespace neuron::engine {
namespace {

std::atomic<int> g_active{0};
thread_local int t_depth = 0;
trace::Counter g_region_runs("compiled_region_runs");

// Region boundaries cut like a sync does, without waiting.
void cut_here() {
  if (initialized()) flush_windows(current_device(), trace::CutReason::kRegion);
}

}  // namespace

void enter_compiled_region() {
  // The open segment ends before the graph's first op, so the graph's segments have the
  // same keys at every run whatever ran before it.
  if (t_depth == 0) {
    g_active.fetch_add(1, std::memory_order_acq_rel);
    cut_here();
    g_region_runs += 1;
  }
  ++t_depth;
}

void exit_compiled_region() {
  if (t_depth == 0) return;
  if (t_depth == 1) cut_here();  // still inside: the last segment compiles at first sight
  if (--t_depth == 0) g_active.fetch_sub(1, std::memory_order_acq_rel);
}

bool any_compiled_region() { return g_active.load(std::memory_order_relaxed) > 0; }
bool in_compiled_region() { return t_depth > 0; }
uint64_t compiled_region_runs() { return g_region_runs.load(); }

}  // namespace neuron::engine
