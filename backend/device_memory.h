// Simulated HBM of one NeuronCore: host memory with a capacity, a caching free list
// per size class, and the counters behind torch.neuron.memory_stats().
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <map>
#include <vector>

namespace neuron::backend {

class Stream;

struct MemoryStat {
  int64_t current = 0, peak = 0, allocated = 0, freed = 0;
  void add(int64_t n);
  void sub(int64_t n);
};

struct MemoryStats {
  MemoryStat allocated_bytes;  // bytes in live blocks (rounded sizes)
  MemoryStat requested_bytes;  // bytes asked for by callers
  MemoryStat reserved_bytes;   // live + cached
  MemoryStat allocations;      // live blocks
  MemoryStat segments;         // blocks obtained from the host
  int64_t num_alloc_retries = 0;
  int64_t num_ooms = 0;
  int64_t num_device_alloc = 0;
  int64_t num_device_free = 0;
};

class DeviceMemory {
 public:
  DeviceMemory(int device, size_t capacity);
  ~DeviceMemory();
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  // A block of at least bytes, 64-byte aligned, or nullptr when it does not fit in the
  // capacity even after the cache is released (the caller may sync and retry). The block
  // belongs to `stream` (the host's current stream): its work uses it in FIFO order.
  void* allocate(size_t bytes, const Stream* stream = nullptr);
  void free(void* ptr);
  // Frees a block whose own stream still has `ticket` items to run before it is done with
  // it (and no other stream uses it): later work on that stream may reuse it at once, as
  // CUDA's caching allocator does (the stream's order makes it safe); other streams only
  // once the stream completed the ticket.
  void free_on_stream(void* ptr, const Stream* stream, uint64_t ticket);
  // Stream-ordered free, in two halves: retire() ends the block's life as a tensor
  // (allocated stats drop) while queued work may still use it; recycle() makes it
  // reusable once that work ran. Retired blocks count as reserved.
  void retire(void* ptr);
  void recycle(void* ptr);
  // Releases cached blocks to the host.
  void empty_cache();
  void note_oom();
  void note_retry();
  void reset_peaks();
  void reset_accumulated();

  MemoryStats stats() const;
  size_t capacity() const { return capacity_; }
  int device() const { return device_; }
  // Whether ptr lies in a live block of this core.
  static size_t block_size(const void* ptr);
  // The core that owns a live block, or -1 for a pointer that is not one of ours.
  static int owner(const void* ptr);
  // The stream a live block was allocated for (nullptr: none recorded).
  static const Stream* stream_of(const void* ptr);
  static size_t round_size(size_t bytes);

 private:
  // A cached block: free for everyone when stream is null or completed ticket, else only
  // for later work on stream.
  struct FreeBlock {
    void* ptr;
    const Stream* stream;
    uint64_t ticket;
    bool free_for(const Stream* s) const;
  };
  void release_cached_locked();
  void push_free_locked(void* ptr, const Stream* stream, uint64_t ticket);
  // A block stops being a tensor's: the allocated stats drop.
  void end_life_locked(void* ptr);

  const int device_;
  const size_t capacity_;
  mutable std::mutex mutex_;
  // A cached block usable for a request of size_class: its own class's most recently freed,
  // else one of the smallest larger class up to a quarter larger (nullptr: none). Sets
  // *block_class to the class of the block taken.
  void* take_cached_locked(size_t size_class, const Stream* stream, size_t* block_class);
  std::map<size_t, std::vector<FreeBlock>> free_blocks_;  // size class -> blocks, ascending
  size_t cached_bytes_ = 0;
  MemoryStats stats_;
};

}  // namespace neuron::backend
