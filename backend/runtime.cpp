#include "backend/runtime.h"

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

namespace neuron::backend {
namespace {

struct Core {
  explicit Core(int index, size_t hbm) : memory(index, hbm) {}
  DeviceMemory memory;
  std::array<std::atomic<Stream*>, kMaxStreamsPerCore> streams{};
  std::atomic<int64_t> next_stream{1};
  std::mutex create_mutex;
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
    slot.store(s, std::memory_order_release);
  }
  return *s;
}

int64_t new_stream(int core) {
  Core& c = core_at(core);
  int64_t n = c.next_stream.fetch_add(1);
  return 1 + (n - 1) % (kMaxStreamsPerCore - 1);
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

int64_t pending_work(int core) {
  int64_t n = 0;
  for (auto& slot : core_at(core).streams)
    if (Stream* s = slot.load(std::memory_order_acquire)) n += s->pending();
  return n;
}

}  // namespace neuron::backend
