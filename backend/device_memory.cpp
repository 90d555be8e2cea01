#include "backend/device_memory.h"

#include <cstdlib>
#include <new>

#include "backend/stream.h"

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
  const Stream* stream;
};
constexpr uint64_t kMagic = 0x6e6575726f6e4d45ull;

// Blocks of 1 MiB and more start on a page: the bytes in front of the user pointer are a
// page, the header its last 64. Where a large block starts within its page changes the
// speed of code that is not ours: Gloo's all_reduce of 64 MiB ran 54 ms on a page-aligned
// buffer, 60 ms at offset 64 (CPU tensors) and 78 ms at offset 128, where aligned_alloc
// put these blocks before (2 processes, this VM).
constexpr size_t kPage = 4096;
constexpr size_t kPageAlignedFrom = size_t{1} << 20;
size_t lead_of(size_t size_class) { return size_class >= kPageAlignedFrom ? kPage : kHeader; }

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

const Stream* DeviceMemory::stream_of(const void* ptr) {
  BlockHeader* h = header_of(ptr);
  return h->magic == kMagic ? h->stream : nullptr;
}

bool DeviceMemory::FreeBlock::free_for(const Stream* s) const {
  return stream == nullptr || stream == s || stream->completed() >= ticket;
}

size_t DeviceMemory::block_size(const void* ptr) {
  BlockHeader* h = header_of(ptr);
  return h->magic == kMagic ? h->size_class : 0;
}

int DeviceMemory::owner(const void* ptr) {
  BlockHeader* h = header_of(ptr);
  return h->magic == kMagic ? static_cast<int>(h->device) : -1;
}

// A request with no cached block of its own size class takes one of a larger class up to
// a quarter larger before asking the host for fresh memory. Shapes that change (a batch
// size every few steps, a growing KV cache) otherwise made every new size class take
// fresh, never-touched memory: on this VM its first touch costs 150-200 us per 200 KiB
// output in page faults, 5x the kernel that writes it (and reserved memory grew with the
// number of sizes seen). The block keeps its class; the slack is bounded by the quarter.
constexpr size_t kReuseSlackDivisor = 4;

void* DeviceMemory::take_cached_locked(size_t size_class, const Stream* stream, size_t* block_class) {
  const size_t limit = size_class + size_class / kReuseSlackDivisor;
  for (auto it = free_blocks_.lower_bound(size_class); it != free_blocks_.end() && it->first <= limit; ++it) {
    // The most recently freed usable block (warm in cache); a few deep at most, so
    // blocks held for other busy streams cost no long scan.
    auto& blocks = it->second;
    const size_t stop = blocks.size() > 16 ? blocks.size() - 16 : 0;
    for (size_t i = blocks.size(); i > stop; --i) {
      if (!blocks[i - 1].free_for(stream)) continue;
      void* user = blocks[i - 1].ptr;
      blocks.erase(blocks.begin() + static_cast<std::ptrdiff_t>(i - 1));
      cached_bytes_ -= it->first;
      *block_class = it->first;
      return user;
    }
  }
  return nullptr;
}

void* DeviceMemory::allocate(size_t bytes, const Stream* stream) {
  size_t size_class = round_size(bytes);
  std::lock_guard lock(mutex_);
  void* user = take_cached_locked(size_class, stream, &size_class);
  if (user == nullptr) {
    size_t reserved = static_cast<size_t>(stats_.reserved_bytes.current);
    if (reserved + size_class > capacity_) {
      release_cached_locked();
      reserved = static_cast<size_t>(stats_.reserved_bytes.current);
      if (reserved + size_class > capacity_) return nullptr;
    }
    const size_t lead = lead_of(size_class);
    void* raw = std::aligned_alloc(lead, size_class + lead);
    if (raw == nullptr) return nullptr;
    user = static_cast<char*>(raw) + lead;
    stats_.reserved_bytes.add(static_cast<int64_t>(size_class));
    stats_.segments.add(1);
    ++stats_.num_device_alloc;
  }
  BlockHeader* h = header_of(user);
  h->size_class = size_class;
  h->requested = bytes;
  h->magic = kMagic;
  h->device = device_;
  h->stream = stream;
  stats_.allocated_bytes.add(static_cast<int64_t>(size_class));
  stats_.requested_bytes.add(static_cast<int64_t>(bytes));
  stats_.allocations.add(1);
  return user;
}

void DeviceMemory::free(void* ptr) { free_on_stream(ptr, nullptr, 0); }

void DeviceMemory::free_on_stream(void* ptr, const Stream* stream, uint64_t ticket) {
  if (ptr == nullptr) return;
  std::lock_guard lock(mutex_);  // the block leaves the tensors and joins the cache at once
  end_life_locked(ptr);
  push_free_locked(ptr, stream, ticket);
}

void DeviceMemory::end_life_locked(void* ptr) {
  const BlockHeader* h = header_of(ptr);
  stats_.allocated_bytes.sub(static_cast<int64_t>(h->size_class));
  stats_.requested_bytes.sub(static_cast<int64_t>(h->requested));
  stats_.allocations.sub(1);
}

void DeviceMemory::push_free_locked(void* ptr, const Stream* stream, uint64_t ticket) {
  const size_t size_class = header_of(ptr)->size_class;
  free_blocks_[size_class].push_back({ptr, stream, ticket});
  cached_bytes_ += size_class;
}

void DeviceMemory::retire(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard lock(mutex_);
  end_life_locked(ptr);
}

void DeviceMemory::recycle(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard lock(mutex_);
  push_free_locked(ptr, nullptr, 0);
}

void DeviceMemory::release_cached_locked() {
  // Blocks their stream's queued work may still use stay (free_for(nullptr): free for all).
  for (auto& [size_class, blocks] : free_blocks_) {
    std::erase_if(blocks, [&, sc = size_class](const FreeBlock& b) {
      if (!b.free_for(nullptr)) return false;
      header_of(b.ptr)->magic = 0;
      std::free(static_cast<char*>(b.ptr) - lead_of(sc));
      stats_.reserved_bytes.sub(static_cast<int64_t>(sc));
      stats_.segments.sub(1);
      ++stats_.num_device_free;
      cached_bytes_ -= sc;
      return true;
    });
  }
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
