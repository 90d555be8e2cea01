// Finished OpWorks, kept with their vectors' capacity: a queued op then costs no heap
// allocation for its record, arguments and outputs once the pool is warm.
#include <mutex>
#include <vector>

#include "backend/op_work.h"

namespace neuron::backend {

c10::OperatorHandle OpWork::dummy_handle() {
  static c10::OperatorHandle handle =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::empty", "memory_format");
  return handle;
}

namespace {

// The host acquires OpWorks and a worker recycles them, so each thread keeps a batch of
// its own and meets the other at the shared pool once per kBatch items: the pool's lock
// and cache line then move between cores once per batch, not twice per op.
struct Pool {
  std::mutex mutex;
  std::vector<OpWork*> free;
  static constexpr size_t kMax = 4096;
  static constexpr size_t kBatch = 32;
};

Pool& pool() {
  static auto* p = new Pool();  // never destroyed: workers may recycle during exit
  return *p;
}

// A thread's own batch; handed back to the pool when the thread ends.
struct LocalBatch {
  std::vector<OpWork*> items;
  LocalBatch() { items.reserve(2 * Pool::kBatch); }
  ~LocalBatch() { give_back(0); }
  // Moves all but `keep` items to the pool (deleting those it has no room for).
  void give_back(size_t keep) {
    if (items.size() <= keep) return;
    Pool& p = pool();
    std::lock_guard lock(p.mutex);
    while (items.size() > keep) {
      OpWork* w = items.back();
      items.pop_back();
      if (p.free.size() < Pool::kMax) p.free.push_back(w);
      else delete w;
    }
  }
  void take_batch() {
    Pool& p = pool();
    std::lock_guard lock(p.mutex);
    for (size_t i = 0; i < Pool::kBatch && !p.free.empty(); ++i) {
      items.push_back(p.free.back());
      p.free.pop_back();
    }
  }
};

thread_local LocalBatch t_batch;

}  // namespace

std::unique_ptr<OpWork> OpWork::acquire(const c10::OperatorHandle& handle) {
  LocalBatch& b = t_batch;
  if (b.items.empty()) b.take_batch();
  if (b.items.empty()) return std::make_unique<OpWork>(handle);
  OpWork* w = b.items.back();
  b.items.pop_back();
  w->op = handle;
  return std::unique_ptr<OpWork>(w);
}

void OpWork::recycle(std::unique_ptr<OpWork> work) {
  if (!work) return;
  work->clear();
  LocalBatch& b = t_batch;
  b.items.push_back(work.release());
  if (b.items.size() >= 2 * Pool::kBatch) b.give_back(Pool::kBatch);
}

void OpWork::finish(std::unique_ptr<WorkItem> self) {
  recycle(std::unique_ptr<OpWork>(static_cast<OpWork*>(self.release())));
}

void OpWork::clear() {
  record.tensors.clear();
  seq = 0;
  threads = ThreadRule::kFixed;
  core = 0;
  stream = 0;
  values.clear();
  slots.clear();
  inputs.clear();
  output_metas.clear();
  output_storages.clear();
  output_groups.clear();
  output_is_list.clear();
  out_op.reset();
  inplace_op.reset();
  out_refused = nullptr;
}

}  // namespace neuron::backend
