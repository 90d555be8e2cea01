#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "backend/device_memory.h"
#include "backend/event.h"
#include "backend/stream.h"

using namespace neuron::backend;

TEST(DeviceMemory, CachesFreedBlocksAndCountsBytes) {
  DeviceMemory mem(0, 1 << 20);
  void* a = mem.allocate(1000);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(DeviceMemory::owner(a), 0);
  EXPECT_EQ(mem.stats().allocated_bytes.current, 1024);
  mem.free(a);
  EXPECT_EQ(mem.stats().allocated_bytes.current, 0);
  EXPECT_EQ(mem.stats().reserved_bytes.current, 1024);
  void* b = mem.allocate(900);  // same size class: the cached block comes back
  EXPECT_EQ(a, b);
  mem.free(b);
  mem.empty_cache();
  EXPECT_EQ(mem.stats().reserved_bytes.current, 0);
}

TEST(DeviceMemory, RefusesPastCapacityAndRecovers) {
  DeviceMemory mem(1, 4096);
  void* a = mem.allocate(3000);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(mem.allocate(3000), nullptr);
  mem.free(a);
  void* b = mem.allocate(4000);  // the cache is released to make room
  EXPECT_NE(b, nullptr);
  mem.free(b);
}

namespace {
class CountItem : public WorkItem {
 public:
  CountItem(std::atomic<int>* n, int expect) : n_(n), expect_(expect) {}
  void run() override {
    if (n_->load() != expect_) throw std::runtime_error("out of order");
    n_->fetch_add(1);
  }
  std::string describe() const override { return "count"; }
  std::atomic<int>* n_;
  int expect_;
};
class FailItem : public WorkItem {
 public:
  void run() override { throw std::runtime_error("boom"); }
  std::string describe() const override { return "aten::fail"; }
};
}  // namespace

TEST(Stream, RunsItemsInFifoOrder) {
  Stream s(0, 1);
  std::atomic<int> n{0};
  for (int i = 0; i < 1000; ++i) s.enqueue(std::make_unique<CountItem>(&n, i));
  s.synchronize();
  EXPECT_EQ(n.load(), 1000);
  EXPECT_TRUE(s.idle());
}

TEST(Stream, WorkerErrorSurfacesAtNextSyncNamingTheItem) {
  Stream s(0, 2);
  s.enqueue(std::make_unique<FailItem>());
  try {
    s.synchronize();
    FAIL() << "expected WorkerError";
  } catch (const WorkerError& e) {
    EXPECT_NE(std::string(e.what()).find("aten::fail"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("boom"), std::string::npos);
  }
  s.synchronize();  // the error was reported once
}

TEST(Event, OrdersTwoStreams) {
  Stream a(0, 3), b(0, 4);
  auto event = std::make_shared<Event>(0);
  std::atomic<int> n{0};
  a.enqueue(std::make_unique<CountItem>(&n, 0));
  event->record(a);
  event->block(b);
  b.enqueue(std::make_unique<CountItem>(&n, 1));
  b.synchronize();
  EXPECT_EQ(n.load(), 2);
  EXPECT_TRUE(event->query());
}

namespace {
// Blocks the worker until released, so a stream can be kept busy on purpose.
class GateItem : public WorkItem {
 public:
  explicit GateItem(std::atomic<bool>* open) : open_(open) {}
  void run() override {
    while (!open_->load()) std::this_thread::yield();
  }
  std::string describe() const override { return "gate"; }

 private:
  std::atomic<bool>* open_;
};
}  // namespace

TEST(DeviceMemory, BlockFreedOnItsBusyStreamIsReusedByThatStreamAtOnce) {
  DeviceMemory mem(0, 1 << 20);
  Stream s(0, 40), other(0, 41);
  std::atomic<bool> open{false};
  s.enqueue(std::make_unique<GateItem>(&open));  // queued work may still use the block
  void* a = mem.allocate(4096, &s);
  EXPECT_EQ(DeviceMemory::stream_of(a), &s);
  mem.free_on_stream(a, &s, s.enqueued());
  EXPECT_EQ(mem.stats().allocated_bytes.current, 0);
  // Another stream must not get it while s has not run what was queued before the free.
  void* b = mem.allocate(4096, &other);
  EXPECT_NE(b, a);
  // The same stream may: its later work runs after the work queued before the free.
  void* c = mem.allocate(4096, &s);
  EXPECT_EQ(c, a);
  mem.free_on_stream(c, &s, s.enqueued());
  open = true;
  s.synchronize();
  void* d = mem.allocate(4096, &other);  // s ran everything: free for all now
  EXPECT_EQ(d, a);
  mem.free(b);
  mem.free(d);
  // Reserved memory did not grow past the two blocks in use at once.
  EXPECT_EQ(mem.stats().reserved_bytes.peak, 2 * 4096);
}

TEST(DeviceMemory, EmptyCacheKeepsBlocksAStreamMayStillUse) {
  DeviceMemory mem(0, 1 << 20);
  Stream s(0, 42);
  std::atomic<bool> open{false};
  s.enqueue(std::make_unique<GateItem>(&open));
  void* a = mem.allocate(8192, &s);
  mem.free_on_stream(a, &s, s.enqueued());
  mem.empty_cache();
  EXPECT_EQ(mem.stats().reserved_bytes.current, 8192);  // still cached, not released
  open = true;
  s.synchronize();
  mem.empty_cache();
  EXPECT_EQ(mem.stats().reserved_bytes.current, 0);
}

TEST(Event, DeferredWaitsCoverEachOtherAndOrderTheNextItem) {
  Stream comm(0, 43), current(0, 44);
  std::atomic<bool> open{false};
  std::atomic<int> n{0};
  comm.enqueue(std::make_unique<GateItem>(&open));
  auto first = std::make_shared<Event>(0), second = std::make_shared<Event>(0);
  first->record(comm);
  comm.enqueue(std::make_unique<CountItem>(&n, 0));
  second->record(comm);
  const uint64_t before = current.enqueued();
  first->block_deferred(current);
  second->block_deferred(current);  // replaces the first: comm runs in order
  EXPECT_EQ(current.enqueued(), before);  // held, not queued
  EXPECT_FALSE(current.idle());           // a held wait is work
  current.enqueue(std::make_unique<CountItem>(&n, 1));  // runs after comm's item
  EXPECT_EQ(current.enqueued(), before + 2);  // the one held wait, then the item
  open.store(true);
  current.synchronize();
  EXPECT_EQ(n.load(), 2);
  EXPECT_TRUE(current.idle());
  // A held wait alone is queued by a sync.
  std::atomic<bool> open2{false};
  comm.enqueue(std::make_unique<GateItem>(&open2));
  auto third = std::make_shared<Event>(0);
  third->record(comm);
  third->block_deferred(current);
  EXPECT_FALSE(current.idle());
  std::thread release([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    open2.store(true);
  });
  current.synchronize();
  EXPECT_TRUE(third->query());
  release.join();
  EXPECT_TRUE(current.idle());
}

TEST(DeviceMemory, BlocksOfAMebibyteAndMoreStartOnAPage) {
  DeviceMemory mem(0, size_t{64} << 20);
  void* small = mem.allocate(1000);
  void* large = mem.allocate(size_t{3} << 20);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small) % 64, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(large) % 4096, 0u);
  EXPECT_EQ(DeviceMemory::owner(large), 0);
  EXPECT_EQ(DeviceMemory::block_size(large), size_t{3} << 20);
  mem.free(small);
  mem.free(large);
  mem.empty_cache();  // frees both from their own starts (ASan checks the pointers)
  EXPECT_EQ(mem.stats().reserved_bytes.current, 0);
}

TEST(DeviceMemory, ASmallerRequestReusesACachedBlockUpToAQuarterLarger) {
  DeviceMemory mem(0, size_t{64} << 20);
  void* a = mem.allocate(100 * 1024);
  mem.free(a);
  // 90 KiB: no block of its own class is cached; the 100 KiB one is within a quarter.
  void* b = mem.allocate(90 * 1024);
  EXPECT_EQ(b, a);
  EXPECT_EQ(DeviceMemory::block_size(b), DeviceMemory::round_size(100 * 1024));  // it keeps its class
  EXPECT_EQ(mem.stats().num_device_alloc, 1);
  mem.free(b);
  // 50 KiB: the cached block is twice its size, more than the slack: fresh memory.
  void* c = mem.allocate(50 * 1024);
  EXPECT_NE(c, a);
  EXPECT_EQ(mem.stats().num_device_alloc, 2);
  // Its own class first: 100 KiB again takes the cached 100 KiB block.
  void* d = mem.allocate(100 * 1024);
  EXPECT_EQ(d, a);
  mem.free(c);
  mem.free(d);
  mem.empty_cache();
  EXPECT_EQ(mem.stats().reserved_bytes.current, 0);
  EXPECT_EQ(mem.stats().allocated_bytes.current, 0);
}
