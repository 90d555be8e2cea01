#include "engine/compiled_region.h"

#include <mutex>
#include <unordered_map>

#include "engine/engine.h"
#include "engine/recording.h"
#include "trace/counters.h"

namespace neuron::engine {
namespace {

std::atomic<int> g_active{0};
thread_local int t_depth = 0;
thread_local uint64_t t_graph = 0;
thread_local bool t_autotune = false;
trace::Counter g_region_runs("compiled_region_runs");
trace::Counter g_overflows("compiled_region_overflows");  // graphs past region_max_programs

// Per graph: keys compiled at first sight (a graph with dynamic shapes sees many).
struct Programs {
  std::mutex mutex;
  std::unordered_map<uint64_t, uint32_t> by_graph;
};
Programs& programs() {
  static auto* p = new Programs();
  return *p;
}

// Region boundaries cut like a sync does, without waiting.
void cut_here() {
  if (initialized()) flush_windows(current_device(), trace::CutReason::kRegion);
}

}  // namespace

void enter_compiled_region(uint64_t graph, bool autotune) {
  // The open segment ends before the graph's first op, so the graph's segments have the
  // same keys at every run whatever ran before it.
  if (t_depth == 0) {
    t_graph = graph;
    t_autotune = autotune;
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

bool region_autotunes() { return t_depth > 0 && t_autotune; }
bool any_compiled_region() { return g_active.load(std::memory_order_relaxed) > 0; }
void forget_first_sight_programs() {
  std::lock_guard lock(programs().mutex);
  programs().by_graph.clear();
}

bool first_sight_compiles(uint32_t max_programs) {
  if (t_depth == 0) return false;
  std::lock_guard lock(programs().mutex);
  auto it = programs().by_graph.find(t_graph);
  return it == programs().by_graph.end() || it->second < max_programs;
}

void note_first_sight_program(uint32_t max_programs) {
  if (t_depth == 0) return;
  std::lock_guard lock(programs().mutex);
  if (++programs().by_graph[t_graph] == max_programs) g_overflows += 1;
}
uint64_t compiled_region_runs() { return g_region_runs.load(); }

}  // namespace neuron::engine
