// The device allocator (simulated HBM with a caching free list per core) and the
// pinned host allocator of the `neuron` backend.
#include "engine/device_allocator.h"

#include <c10/core/CachingDeviceAllocator.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "backend/runtime.h"
#include "engine/engine.h"
#include "engine/pch.h"
#include "engine/recording.h"

namespace neuron::engine {
namespace {

constexpr auto kNeuron = c10::DeviceType::PrivateUse1;

std::string format_bytes(size_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.2f %s", v, units[u]);
  return buf;
}

void free_device_block(void* ptr) { backend::free_block(ptr); }

class NeuronAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t bytes) override {
    const c10::DeviceIndex index = current_device();
    const c10::Device device(kNeuron, index);
    if (bytes == 0) return {nullptr, nullptr, &free_device_block, device};
    backend::DeviceMemory& memory = backend::memory(index);
    backend::reclaim_blocks(index);
    const backend::Stream* stream = &current_stream(index);
    void* ptr = memory.allocate(bytes, stream);
    if (ptr == nullptr) {
      // Freed blocks may wait for queued work, and held ops pin storages: let it all run.
      memory.note_retry();
      flush_windows(index);
      backend::drain_core(index);
      backend::reclaim_blocks(index);
      memory.empty_cache();
      ptr = memory.allocate(bytes, stream);
    }
    if (ptr == nullptr) {
      memory.note_oom();
      auto s = memory.stats();
      TORCH_CHECK_WITH(OutOfMemoryError, false, "neuron:", int(index),
                       " out of memory: tried to allocate ", format_bytes(bytes),
                       "; the core has ", format_bytes(memory.capacity()),
                       " of HBM (NEURON_HBM_BYTES), ", format_bytes(s.allocated_bytes.current),
                       " allocated by tensors and ", format_bytes(s.reserved_bytes.current),
                       " reserved. Free tensors or raise NEURON_HBM_BYTES.");
    }
    return {ptr, ptr, &free_device_block, device};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &free_device_block; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    synchronize_all();
    std::memcpy(dest, src, count);
  }

  bool initialized() override { return engine::initialized(); }

  void emptyCache(c10::MempoolId_t) override {
    for (int i = 0; i < device_count(); ++i) {
      flush_windows(static_cast<c10::DeviceIndex>(i));
      backend::drain_core(i);
      backend::reclaim_blocks(i);
      backend::memory(i).empty_cache();
    }
  }

  void recordStream(const c10::DataPtr&, c10::Stream) override {}

  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex index) override {
    check_device_index(index);
    auto s = backend::memory(index).stats();
    c10::CachingDeviceAllocator::DeviceStats out;
    auto fill = [](c10::CachingAllocator::StatArray& dst, const backend::MemoryStat& src) {
      for (auto& stat : dst) {
        stat.current = src.current;
        stat.peak = src.peak;
        stat.allocated = src.allocated;
        stat.freed = src.freed;
      }
    };
    fill(out.allocated_bytes, s.allocated_bytes);
    fill(out.active_bytes, s.allocated_bytes);
    fill(out.requested_bytes, s.requested_bytes);
    fill(out.reserved_bytes, s.reserved_bytes);
    fill(out.allocation, s.allocations);
    fill(out.active, s.allocations);
    fill(out.segment, s.segments);
    out.num_alloc_retries = s.num_alloc_retries;
    out.num_ooms = s.num_ooms;
    out.num_device_alloc = s.num_device_alloc;
    out.num_device_free = s.num_device_free;
    return out;
  }

  void resetAccumulatedStats(c10::DeviceIndex index) override {
    check_device_index(index);
    backend::memory(index).reset_accumulated();
  }

  void resetPeakStats(c10::DeviceIndex index) override {
    check_device_index(index);
    backend::memory(index).reset_peaks();
  }

  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex index) override {
    check_device_index(index);
    auto& memory = backend::memory(index);
    size_t reserved = static_cast<size_t>(memory.stats().reserved_bytes.current);
    return {memory.capacity() - std::min(reserved, memory.capacity()), memory.capacity()};
  }
};

NeuronAllocator g_allocator;
REGISTER_ALLOCATOR(kNeuron, &g_allocator);

// Page-locked host memory is just aligned host memory here; we remember the ranges so
// is_pinned() can answer.
class PinnedAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t bytes) override {
    void* ptr = bytes == 0 ? nullptr : std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (bytes != 0 && ptr == nullptr) TORCH_CHECK(false, "neuron: pinned allocation failed");
    if (ptr != nullptr) {
      std::lock_guard lock(mutex());
      ranges()[reinterpret_cast<uintptr_t>(ptr)] = bytes;
    }
    return {ptr, ptr, &release, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
  static bool contains(const void* p) {
    auto addr = reinterpret_cast<uintptr_t>(p);
    std::lock_guard lock(mutex());
    auto it = ranges().upper_bound(addr);
    if (it == ranges().begin()) return false;
    --it;
    return addr < it->first + std::max<size_t>(it->second, 1);
  }

 private:
  static void release(void* ptr) {
    if (ptr == nullptr) return;
    {
      std::lock_guard lock(mutex());
      ranges().erase(reinterpret_cast<uintptr_t>(ptr));
    }
    std::free(ptr);
  }
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::map<uintptr_t, size_t>& ranges() {
    static auto* r = new std::map<uintptr_t, size_t>();
    return *r;
  }
};

PinnedAllocator g_pinned_allocator;

}  // namespace

c10::Allocator* pinned_allocator() { return &g_pinned_allocator; }
bool is_pinned_pointer(const void* ptr) { return PinnedAllocator::contains(ptr); }

}  // namespace neuron::engine
