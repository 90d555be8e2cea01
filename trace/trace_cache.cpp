#include "trace/trace_cache.h"

namespace neuron::trace {

TraceCache::Lookup TraceCache::observe(const Segment& segment, uint64_t now_ns,
                                       uint64_t* count_out) {
  std::lock_guard lock(mutex_);
  auto it = entries_.find(segment.key);
  if (it == entries_.end()) {
    SegmentEntry e;
    e.words = segment.words;
    e.length = segment.length;
    e.count = 1;
    e.first_seen_ns = e.last_seen_ns = now_ns;
    entries_.emplace(segment.key, std::move(e));
    ++stats_.misses;
    if (count_out) *count_out = 1;
    return Lookup::kMiss;
  }
  SegmentEntry& e = it->second;
  if (e.words != segment.words) {
    ++stats_.collisions;
    if (count_out) *count_out = 0;
    return Lookup::kCollision;
  }
  ++e.count;
  e.last_seen_ns = now_ns;
  ++stats_.hits;
  if (e.state == SegmentState::kCold && e.count >= hot_threshold_) {
    ++stats_.transitions[static_cast<size_t>(e.state)][static_cast<size_t>(SegmentState::kHot)];
    e.state = SegmentState::kHot;
    emit_state_event(segment.key, SegmentState::kCold, SegmentState::kHot, e.count);
  }
  if (count_out) *count_out = e.count;
  return Lookup::kHit;
}

bool TraceCache::transition(uint64_t key, SegmentState to) {
  std::lock_guard lock(mutex_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return false;
  const SegmentState from = it->second.state;
  if (!transition_allowed(from, to)) {
    ++stats_.illegal_transitions;
    return false;
  }
  ++stats_.transitions[static_cast<size_t>(from)][static_cast<size_t>(to)];
  it->second.state = to;
  emit_state_event(key, from, to, it->second.count);
  return true;
}

SegmentState TraceCache::state(uint64_t key) const {
  std::lock_guard lock(mutex_);
  auto it = entries_.find(key);
  return it == entries_.end() ? SegmentState::kCold : it->second.state;
}

bool TraceCache::find(uint64_t key, SegmentEntry& out) const {
  std::lock_guard lock(mutex_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return false;
  out = it->second;
  return true;
}

TraceCache::Stats TraceCache::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

size_t TraceCache::size() const {
  std::lock_guard lock(mutex_);
  return entries_.size();
}

void TraceCache::clear() {
  std::lock_guard lock(mutex_);
  entries_.clear();
  stats_ = Stats{};
}

}  // namespace neuron::trace
