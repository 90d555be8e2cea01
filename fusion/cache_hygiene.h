// Keeping the persistent kernel cache (native_cache.h) small and clean while processes
// share it: a size bound enforced by evicting whole entries least recently used first
// (each under its key's lock, taken without waiting, so an entry another process is
// building or loading is skipped), and temporaries left by dead processes collected when
// a process first opens the cache. A process that loaded a kernel keeps running it after
// its file is evicted (the mapping stays); later processes rebuild it.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "fusion/native_cache.h"

namespace neuron::fusion {

// NEURON_CACHE_MAX_BYTES when unset.
inline constexpr uint64_t kDefaultCacheMaxBytes = uint64_t{1} << 30;
// What an eviction leaves, in eighths of the bound.
inline constexpr uint64_t kEvictToEighths = 7;
// A temporary of a live process is collected only when this old (its pid may have been
// reused by an unrelated process).
inline constexpr std::chrono::seconds kStaleTemporaryAge = std::chrono::minutes(10);

struct CacheEntryInfo {
  std::string key;
  uint64_t bytes = 0;        // all its files
  int64_t last_use_ns = 0;   // the object's mtime (or its newest file's), ns since the epoch
  bool has_object = false;   // KEY.so (else a failed build's source and log, or a leftover)
  bool verified = false;     // KEY.ok
};

struct CacheUsage {
  std::vector<CacheEntryInfo> entries;  // by key
  uint64_t total_bytes = 0;             // every file in the folder, temporaries included
  uint64_t temporary_bytes = 0;
  size_t temporaries = 0;
};

// One scan of the cache's folder (empty when it does not exist).
CacheUsage scan_cache(const NativeCache& cache);

// Removes the temporaries (NAME.tmp.PID.TAG) of processes that are gone, and any older
// than max_age; never this process's own. Returns how many it removed.
size_t collect_stale_temporaries(const NativeCache& cache,
                                 std::chrono::seconds max_age = kStaleTemporaryAge);

struct Eviction {
  uint64_t bytes_before = 0, bytes_after = 0;
  size_t evicted = 0;
  size_t busy = 0;  // entries skipped: their lock was held
};

// When the folder holds more than max_bytes, evicts least recently used entries (never
// `keep`) until it holds at most 7/8 of it (room for the markers written after a build and
// the next builds), or only busy entries are left.
Eviction evict_to_bound(const NativeCache& cache, uint64_t max_bytes,
                        const std::string& keep = "");

// Once per folder and process, on its first use: collects stale temporaries and evicts
// to the bound (which may have been lowered since the last run).
void open_cache_once(const NativeCache& cache, uint64_t max_bytes);

struct Cleared {
  size_t removed = 0, busy = 0, temporaries = 0;
};
// Removes every entry whose lock is free and the stale temporaries.
Cleared clear_cache(const NativeCache& cache);

}  // namespace neuron::fusion
