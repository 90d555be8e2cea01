// Per segment key: how often it was seen, its state in the adaptive life cycle, timings,
// and counters for every state transition. Hits are verified against the full words.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "trace/segment_state.h"
#include "trace/segmenter.h"

namespace neuron::trace {

struct SegmentEntry {
  std::vector<int64_t> words;
  uint32_t length = 0;
  uint64_t count = 0;
  SegmentState state = SegmentState::kCold;
  uint64_t first_seen_ns = 0, last_seen_ns = 0;
  uint64_t host_ns = 0;  // host time spent dispatching its ops
};

class TraceCache {
 public:
  enum class Lookup { kMiss, kHit, kCollision };
  struct Stats {
    uint64_t hits = 0, misses = 0, collisions = 0, illegal_transitions = 0;
    std::array<std::array<uint64_t, static_cast<size_t>(SegmentState::kCount)>,
               static_cast<size_t>(SegmentState::kCount)>
        transitions{};
  };

  explicit TraceCache(uint64_t hot_threshold = 3) : hot_threshold_(hot_threshold) {}
  // Counts one occurrence of the segment; a verified hit bumps the count (and turns a
  // cold key hot at the threshold). A collision is counted and reported, never merged.
  Lookup observe(const Segment& segment, uint64_t now_ns, uint64_t* count_out = nullptr);
  // Moves a key to a new state if the life cycle allows it (segment_state.h); an illegal
  // move is counted and refused. Each transition is traced.
  bool transition(uint64_t key, SegmentState to);
  SegmentState state(uint64_t key) const;
  bool find(uint64_t key, SegmentEntry& out) const;
  Stats stats() const;
  void set_hot_threshold(uint64_t n) {
    std::lock_guard lock(mutex_);
    hot_threshold_ = n;
  }
  size_t size() const;
  void clear();

 private:
  mutable std::mutex mutex_;
  std::unordered_map<uint64_t, SegmentEntry> entries_;
  Stats stats_;
  uint64_t hot_threshold_;
};

}  // namespace neuron::trace
