#include "trace/shape_cache.h"

namespace neuron::trace {

bool ShapeCache::lookup(const OpRecord& record, uint64_t key, std::vector<TensorMeta>& out) {
  std::lock_guard lock(mutex_);
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    ++stats_.misses;
    return false;
  }
  if (it->second.signature != record.signature) {
    ++stats_.collisions;
    ++stats_.misses;
    return false;
  }
  ++stats_.hits;
  out.assign(it->second.outputs.begin(), it->second.outputs.end());
  return true;
}

void ShapeCache::insert(const OpRecord& record, uint64_t key,
                        const std::vector<TensorMeta>& outputs) {
  std::lock_guard lock(mutex_);
  // A full cache starts over rather than growing without bound; shapes recur quickly.
  if (entries_.size() >= kMaxEntries) entries_.clear();
  Entry& e = entries_[key];
  e.signature = record.signature;
  e.outputs = outputs;
  ++stats_.inserts;
}

void ShapeCache::clear() {
  std::lock_guard lock(mutex_);
  entries_.clear();
}

ShapeCache::Stats ShapeCache::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

size_t ShapeCache::size() const {
  std::lock_guard lock(mutex_);
  return entries_.size();
}

}  // namespace neuron::trace
