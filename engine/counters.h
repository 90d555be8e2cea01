// Relaxed atomic counters bumped on the dispatch path.
#pragma once

#include <atomic>
#include <cstdint>

namespace neuron::engine {

struct CounterBlock {
  std::atomic<uint64_t> ops_dispatched{0}, ops_queued{0}, ops_synchronous{0}, meta_runs{0}, fast_meta_runs{0},
      shape_cache_hits{0}, shape_cache_misses{0}, views{0}, syncs{0};
  void reset() {
    for (auto* c : {&ops_dispatched, &ops_queued, &ops_synchronous, &meta_runs, &fast_meta_runs, &shape_cache_hits,
                    &shape_cache_misses, &views, &syncs})
      c->store(0);
  }
};

extern CounterBlock g_counters;

inline void bump(std::atomic<uint64_t>& c) { c.fetch_add(1, std::memory_order_relaxed); }

}  // namespace neuron::engine
