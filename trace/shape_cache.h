// Output geometry by op signature: the steady state answers shape inference from here
// instead of rerunning a meta kernel. Two-level: XXH3 key, then the full signature.
#pragma once

#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "trace/op_record.h"

namespace neuron::trace {

class ShapeCache {
 public:
  struct Stats {
    uint64_t hits = 0, misses = 0, collisions = 0, inserts = 0;
  };

  // Copies the cached outputs of record into out and returns true on a verified hit.
  bool lookup(const OpRecord& record, uint64_t key, std::vector<TensorMeta>& out);
  void insert(const OpRecord& record, uint64_t key, const std::vector<TensorMeta>& outputs);
  void clear();
  Stats stats() const;
  size_t size() const;

 private:
  struct Entry {
    std::vector<int64_t> signature;
    std::vector<TensorMeta> outputs;
  };
  mutable std::mutex mutex_;
  std::unordered_map<uint64_t, Entry> entries_;
  Stats stats_;
  static constexpr size_t kMaxEntries = 1 << 16;
};

}  // namespace neuron::trace
