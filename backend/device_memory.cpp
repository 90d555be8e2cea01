#include "backend/device_memory.h"

#include <cstdlib>
#include <new>

namespace neuron::backend {
namespace {

// Each block carries a header in front of the user pointer: its size class and the
// requested size, so free needs no lookup table.
constexpr size_t kHeader = 64;
struct BlockHeader {
  size_t size_class;
  size_t requested;
  uint64_t magic;
  int64_t device;
};
constexpr uint64_t kMagic = 0x6e6575726f6e4d45ull;

BlockHeader* header_of(const void* ptr) {
  return reinterpret_cast<BlockHeader*>(static_cast<char*>(const_cast<void*>(ptr)) - kHeader);
}

}  // namespace

void MemoryStat::add(int64_t n) {
  current += n;
  allocated += n;
  if (current > peak) peak = current;
}

void MemoryStat::sub(int64_t n) {
  current -= n;
  freed += n;
}

DeviceMemory::DeviceMemory(int device, size_t capacity) : device_(device), capacity_(capacity) {}

DeviceMemory::~DeviceMemory() {
  std::lock_guard lock(mutex_);
  release_cached_locked();
}

size_t DeviceMemory::round_size(size_t bytes) {
  constexpr size_t kSmall = 512, kLarge = size_t{1} << 20;
  if (bytes <= kSmall) return kSmall;
  if (bytes < kLarge) return (bytes + kSmall - 1) / kSmall * kSmall;
  return (bytes + kLarge - 1) / kLarge * kLarge;
}

size_t DeviceMemory::block_size(const void* ptr) {
  BlockHeader* h = header_of(ptr);
  return h->magic == kMagic ? h->size_class : 0;
}

int DeviceMemory::owner(const void* ptr) {
  BlockHeader* h = header_of(ptr);
  return h->magic == kMagic ? static_cast<int>(h->device) : -1;
}

void* DeviceMemory::allocate(size_t bytes) {
  const size_t size_class = round_size(bytes);
  std::lock_guard lock(mutex_);
  void* user = nullptr;
  auto it = free_blocks_.find(size_class);
  if (it != free_blocks_.end() && !it->second.empty()) {
    user = it->second.back();
    it->second.pop_back();
    cached_bytes_ -= size_class;
  } else {
    size_t reserved = static_cast<size_t>(stats_.reserved_bytes.current);
    if (reserved + size_class > capacity_) {
      release_cached_locked();
      reserved = static_cast<size_t>(stats_.reserved_bytes.current);
      if (reserved + size_class > capacity_) return nullptr;
    }
    void* raw = std::aligned_alloc(64, size_class + kHeader);
    if (raw == nullptr) return nullptr;
    user = static_cast<char*>(raw) + kHeader;
    stats_.reserved_bytes.add(static_cast<int64_t>(size_class));
    stats_.segments.add(1);
    ++stats_.num_device_alloc;
  }
  BlockHeader* h = header_of(user);
  h->size_class = size_class;
  h->requested = bytes;
  h->magic = kMagic;
  h->device = device_;
  stats_.allocated_bytes.add(static_cast<int64_t>(size_class));
  stats_.requested_bytes.add(static_cast<int64_t>(bytes));
  stats_.allocations.add(1);
  return user;
}

void DeviceMemory::free(void* ptr) {
  if (ptr == nullptr) return;
  BlockHeader* h = header_of(ptr);
  std::lock_guard lock(mutex_);  // retire and recycle under one lock
  stats_.allocated_bytes.sub(static_cast<int64_t>(h->size_class));
  stats_.requested_bytes.sub(static_cast<int64_t>(h->requested));
  stats_.allocations.sub(1);
  free_blocks_[h->size_class].push_back(ptr);
  cached_bytes_ += h->size_class;
}

void DeviceMemory::retire(void* ptr) {
  if (ptr == nullptr) return;
  BlockHeader* h = header_of(ptr);
  std::lock_guard lock(mutex_);
  stats_.allocated_bytes.sub(static_cast<int64_t>(h->size_class));
  stats_.requested_bytes.sub(static_cast<int64_t>(h->requested));
  stats_.allocations.sub(1);
}

void DeviceMemory::recycle(void* ptr) {
  if (ptr == nullptr) return;
  BlockHeader* h = header_of(ptr);
  std::lock_guard lock(mutex_);
  free_blocks_[h->size_class].push_back(ptr);
  cached_bytes_ += h->size_class;
}

void DeviceMemory::release_cached_locked() {
  for (auto& [size_class, blocks] : free_blocks_) {
    for (void* user : blocks) {
      header_of(user)->magic = 0;
      std::free(static_cast<char*>(user) - kHeader);
      stats_.reserved_bytes.sub(static_cast<int64_t>(size_class));
      stats_.segments.sub(1);
      ++stats_.num_device_free;
    }
    blocks.clear();
  }
  cached_bytes_ = 0;
}

void DeviceMemory::empty_cache() {
  std::lock_guard lock(mutex_);
  release_cached_locked();
}

void DeviceMemory::note_oom() {
  std::lock_guard lock(mutex_);
  ++stats_.num_ooms;
}

void DeviceMemory::note_retry() {
  std::lock_guard lock(mutex_);
  ++stats_.num_alloc_retries;
}

void DeviceMemory::reset_peaks() {
  std::lock_guard lock(mutex_);
  for (MemoryStat* s : {&stats_.allocated_bytes, &stats_.requested_bytes, &stats_.reserved_bytes,
                        &stats_.allocations, &stats_.segments})
    s->peak = s->current;
}

void DeviceMemory::reset_accumulated() {
  std::lock_guard lock(mutex_);
  for (MemoryStat* s : {&stats_.allocated_bytes, &stats_.requested_bytes, &stats_.reserved_bytes,
                        &stats_.allocations, &stats_.segments})
    s->allocated = s->freed = 0;
  stats_.num_alloc_retries = stats_.num_ooms = 0;
  stats_.num_device_alloc = stats_.num_device_free = 0;
}

MemoryStats DeviceMemory::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

}  // namespace neuron::backend
