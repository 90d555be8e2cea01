#include "backend/runtime.h"

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

namespace neuron::backend {
namespace {

// A freed block waiting for the work queued before its free: per busy stream, the
// stream's enqueue count at the free (usually one stream; more spill to the heap).
struct Retired {
  struct Fence {
    const Stream* stream;
    uint64_t ticket;
  };
  void* ptr = nullptr;
  uint32_t count = 0;
  std::array<Fence, 2> fences{};
  std::unique_ptr<std::vector<Fence>> more;

  bool ready() const {
    for (uint32_t i = 0; i < count; ++i) {
      const Fence& f = i < fences.size() ? fences[i] : (*more)[i - fences.size()];
      if (f.stream->completed() < f.ticket) return false;
    }
    return true;
  }
};

struct Core {
  explicit Core(int index, size_t hbm) : memory(index, hbm) {}
  DeviceMemory memory;
  std::array<std::atomic<Stream*>, kMaxStreamsPerCore> streams{};
  std::atomic<int64_t> next_stream{1};
  std::mutex create_mutex;
  // Retired blocks in free order, from retired_head on (capacity kept: no allocation
  // once warm).
  std::mutex retired_mutex;
  std::vector<Retired> retired;
  size_t retired_head = 0;
  std::atomic<size_t> retired_pending{0};
};

struct Runtime {
  RuntimeConfig config;
  std::vector<std::unique_ptr<Core>> cores;
};

std::atomic<Runtime*> g_runtime{nullptr};
std::mutex g_init_mutex;

Runtime& runtime() {
  Runtime* r = g_runtime.load(std::memory_order_acquire);
  if (r == nullptr) {
    init(RuntimeConfig{});
    r = g_runtime.load(std::memory_order_acquire);
  }
  return *r;
}

Core& core_at(int core) { return *runtime().cores.at(static_cast<size_t>(core)); }

}  // namespace

bool init(const RuntimeConfig& config) {
  std::lock_guard lock(g_init_mutex);
  if (g_runtime.load() != nullptr) return false;
  // Leaked on purpose: worker threads and storages freed at exit still reach it.
  auto* r = new Runtime();
  r->config = config;
  for (int i = 0; i < config.cores; ++i) r->cores.push_back(std::make_unique<Core>(i, config.hbm_bytes));
  g_runtime.store(r, std::memory_order_release);
  return true;
}

bool initialized() { return g_runtime.load() != nullptr; }
int core_count() { return runtime().config.cores; }
size_t hbm_bytes() { return runtime().config.hbm_bytes; }
DeviceMemory& memory(int core) { return core_at(core).memory; }

Stream& stream(int core, int64_t id) {
  Core& c = core_at(core);
  auto& slot = c.streams.at(static_cast<size_t>(id));
  Stream* s = slot.load(std::memory_order_acquire);
  if (s != nullptr) return *s;
  std::lock_guard lock(c.create_mutex);
  s = slot.load(std::memory_order_acquire);
  if (s == nullptr) {
    s = new Stream(core, id);  // lives for the process, like a hardware queue
    if (id == kCollectiveStream) s->mark_transport();
    slot.store(s, std::memory_order_release);
  }
  return *s;
}

int64_t new_stream(int core) {
  Core& c = core_at(core);
  int64_t n = c.next_stream.fetch_add(1);
  return 1 + (n - 1) % (kCollectiveStream - 1);
}

void synchronize_core(int core) {
  Core& c = core_at(core);
  for (auto& slot : c.streams)
    if (Stream* s = slot.load(std::memory_order_acquire)) s->synchronize();
}

void drain_core(int core) {
  for (auto& slot : core_at(core).streams)
    if (Stream* s = slot.load(std::memory_order_acquire)) s->drain();
}

void synchronize_all() {
  for (int i = 0; i < core_count(); ++i) synchronize_core(i);
}

void free_block(void* ptr) {
  if (ptr == nullptr) return;
  const int owner = DeviceMemory::owner(ptr);
  if (owner < 0) return;
  Core& c = core_at(owner);
  // The block's own stream runs its queued work in order, so its later work may reuse
  // the block at once; other busy streams (which may have been handed the tensor) fence it.
  const Stream* own = DeviceMemory::stream_of(ptr);
  Retired r;
  r.ptr = ptr;
  for (auto& slot : c.streams) {
    const Stream* s = slot.load(std::memory_order_acquire);
    if (s == nullptr || s == own) continue;
    const uint64_t ticket = s->enqueued();
    if (s->completed() >= ticket) continue;
    if (r.count < r.fences.size()) {
      r.fences[r.count] = {s, ticket};
    } else {
      if (!r.more) r.more = std::make_unique<std::vector<Retired::Fence>>();
      r.more->push_back({s, ticket});
    }
    ++r.count;
  }
  if (r.count == 0) {
    const uint64_t ticket = own != nullptr ? own->enqueued() : 0;
    if (own != nullptr && own->completed() < ticket) c.memory.free_on_stream(ptr, own, ticket);
    else c.memory.free(ptr);
    return;
  }
  if (own != nullptr && own->completed() < own->enqueued()) {
    if (r.count < r.fences.size()) {
      r.fences[r.count] = {own, own->enqueued()};
    } else {
      if (!r.more) r.more = std::make_unique<std::vector<Retired::Fence>>();
      r.more->push_back({own, own->enqueued()});
    }
    ++r.count;
  }
  c.memory.retire(ptr);
  std::lock_guard lock(c.retired_mutex);
  c.retired.push_back(std::move(r));
  c.retired_pending.fetch_add(1, std::memory_order_release);
}

void reclaim_blocks(int core) {
  Core& c = core_at(core);
  if (c.retired_pending.load(std::memory_order_acquire) == 0) return;
  std::lock_guard lock(c.retired_mutex);
  // Frees on one stream retire in order: stop at the first block still in use (a
  // block waiting on another stream may hold back later ones until then).
  size_t done = 0;
  while (c.retired_head < c.retired.size() && c.retired[c.retired_head].ready()) {
    c.memory.recycle(c.retired[c.retired_head].ptr);
    c.retired[c.retired_head].more.reset();
    ++c.retired_head;
    ++done;
  }
  c.retired_pending.fetch_sub(done, std::memory_order_release);
  if (c.retired_head == c.retired.size()) {
    c.retired.clear();
    c.retired_head = 0;
  } else if (c.retired_head > 1024 && c.retired_head * 2 > c.retired.size()) {
    c.retired.erase(c.retired.begin(), c.retired.begin() + static_cast<std::ptrdiff_t>(c.retired_head));
    c.retired_head = 0;
  }
}

int64_t pending_work(int core) {
  int64_t n = 0;
  for (auto& slot : core_at(core).streams)
    if (Stream* s = slot.load(std::memory_order_acquire)) n += s->pending();
  return n;
}

int64_t busy_time_ns(int core) {
  int64_t ns = 0;
  for (auto& slot : core_at(core).streams)
    if (Stream* s = slot.load(std::memory_order_acquire)) ns += s->busy_ns();
  return ns;
}

void reset_busy_time() {
  for (int i = 0; i < core_count(); ++i)
    for (auto& slot : core_at(i).streams)
      if (Stream* s = slot.load(std::memory_order_acquire)) s->reset_busy();
}

}  // namespace neuron::backend
