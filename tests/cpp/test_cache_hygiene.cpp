// Cache hygiene without torch: eviction to the bound, least recently used first and never
// an entry whose lock another holder has; a lock file removed under a waiting process;
// temporaries of dead processes collected on a cache's first open; and a cache that
// cannot be written costing only a private build.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "fusion/atomic_file.h"
#include "fusion/cache_hygiene.h"
#include "fusion/native.h"
#include "fusion/native_cache.h"
#include "tests/cpp/native_test_util.h"

using namespace neuron::fusion;
using namespace neuron::fusion::test_util;

namespace {

// Sets a file's mtime to `seconds_ago` before now.
void age(const std::string& path, int seconds_ago) {
  timespec times[2];
  ::clock_gettime(CLOCK_REALTIME, &times[0]);
  times[0].tv_sec -= seconds_ago;
  times[1] = times[0];
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0) << path;
}

// A pid no process has (a child that exited and was reaped).
pid_t dead_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  ::waitpid(pid, nullptr, 0);
  return pid;
}

// Entries a, b, c, d of 1000 bytes each (plus a 20-byte checksum), last used in that order.
struct FourEntries : ::testing::Test {
  TempDir root;
  NativeCache cache = NativeCache::in_root(root.path.string());
  void SetUp() override {
    ASSERT_FALSE(cache.create());
    int ago = 400;
    for (const char* key : {"a", "b", "c", "d"}) {
      commit_entry(cache, key, std::string(1000, 'x'));
      age(cache.object_path(key), ago -= 100);
    }
  }
  bool present(const std::string& key) const { return fs::exists(cache.object_path(key)); }
};

}  // namespace

TEST_F(FourEntries, ScanCountsEveryFileAndDatesEntriesByTheirObject) {
  ASSERT_TRUE(cache.mark_verified("b"));  // newer than b's object: not a use
  const CacheUsage u = scan_cache(cache);
  ASSERT_EQ(u.entries.size(), 4u);
  EXPECT_EQ(u.entries[0].key, "a");
  EXPECT_EQ(u.entries[0].bytes, 1000 + file_checksum(cache.object_path("a")).size() + 1);
  EXPECT_TRUE(u.entries[1].verified && u.entries[1].has_object);
  EXPECT_LT(u.entries[1].last_use_ns, u.entries[2].last_use_ns);
  EXPECT_EQ(u.total_bytes, 4 * u.entries[0].bytes + 9);  // + b's marker
  EXPECT_EQ(u.temporaries, 0u);
}

TEST_F(FourEntries, EvictsLeastRecentlyUsedFirstToSevenEighthsOfTheBound) {
  const uint64_t entry = scan_cache(cache).entries[0].bytes;
  EXPECT_EQ(evict_to_bound(cache, 4 * entry).evicted, 0u);  // at the bound: nothing
  cache.touch("a");  // a loaded again: now the newest
  // Over a bound of 2.5 entries: down to 7/8 of it (2.19 entries), so two go.
  const Eviction e = evict_to_bound(cache, 5 * entry / 2);
  EXPECT_EQ(e.evicted, 2u);
  EXPECT_EQ(e.bytes_before, 4 * entry);
  EXPECT_EQ(e.bytes_after, 2 * entry);
  EXPECT_FALSE(present("b"));
  EXPECT_FALSE(present("c"));
  EXPECT_TRUE(present("a") && present("d"));
  EXPECT_EQ(scan_cache(cache).total_bytes, 2 * entry);
  // Whole entries go, their lock files too (the folder's eviction lock stays).
  EXPECT_EQ(names_in(cache.dir()),
            (std::vector<std::string>{".evict.lock", "a.so", "a.so.sum", "d.so", "d.so.sum"}));
}

TEST_F(FourEntries, EvictionSkipsEntriesLockedByOthersAndTheKeptOne) {
  KeyLock held(cache.path("a", ".lock"));  // another process builds or loads a
  ASSERT_TRUE(held.held());
  const Eviction e = evict_to_bound(cache, 1, /*keep=*/"d");
  EXPECT_EQ(e.busy, 1u);
  EXPECT_EQ(e.evicted, 2u);
  EXPECT_TRUE(present("a") && present("d"));
  EXPECT_FALSE(present("b") || present("c"));
  EXPECT_GT(e.bytes_after, 1u);  // only busy or kept entries left: over the bound until later
}

TEST_F(FourEntries, ClearRemovesAllButBusyEntries) {
  auto held = std::make_unique<KeyLock>(cache.path("c", ".lock"));
  const Cleared c = clear_cache(cache);
  EXPECT_EQ(c.removed, 3u);
  EXPECT_EQ(c.busy, 1u);
  EXPECT_EQ(names_in(cache.dir()),
            (std::vector<std::string>{".evict.lock", "c.lock", "c.so", "c.so.sum"}));
  held.reset();  // released: now all of it goes, the folder's eviction lock too
  EXPECT_EQ(clear_cache(cache).removed, 1u);
  EXPECT_TRUE(names_in(cache.dir()).empty());
}

TEST(KeyLock, AWaiterWhoseFileWasRemovedLocksTheNewOne) {
  TempDir dir;
  const std::string path = dir / "k.lock";
  auto first = std::make_unique<KeyLock>(path);
  ASSERT_TRUE(first->held());
  std::atomic<bool> second_held{false}, release{false};
  std::thread waiter([&] {
    KeyLock second(path);  // blocks on the file first holds
    second_held = second.held();
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  first->remove_file();  // eviction: the entry and its lock file go
  first.reset();
  while (!second_held) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // The waiter holds the file now in the folder, so a third process is excluded.
  EXPECT_TRUE(fs::exists(path));
  KeyLock third(path, KeyLock::Wait::kTry);
  EXPECT_FALSE(third.held());
  EXPECT_EQ(third.error(), EWOULDBLOCK);
  release = true;
  waiter.join();
  EXPECT_TRUE(KeyLock(path, KeyLock::Wait::kTry).held());
}

TEST(StaleTemporaries, OnlyThoseOfDeadProcessesOrTooOldAreCollected) {
  TempDir root;
  const NativeCache cache = NativeCache::in_root(root.path.string());
  ASSERT_FALSE(cache.create());
  const std::string dead = std::to_string(dead_pid()), live = std::to_string(::getppid()),
                    self = std::to_string(::getpid());
  write_file(cache.path("k1", ".so.tmp." + dead + ".00ff"), "dead writer");
  write_file(cache.path("k1", ".log.tmp." + dead + ".00ff"), "dead writer's log");
  write_file(cache.path("k2", ".ok.tmp." + dead + ".3"), "write_atomic's");
  write_file(cache.path("k3", ".so.tmp." + live + ".0a"), "a live writer");
  write_file(cache.path("k4", ".so.tmp." + live + ".0b"), "a live pid, 20 minutes old");
  age(cache.path("k4", ".so.tmp." + live + ".0b"), 20 * 60);
  write_file(cache.path("k5", ".so.tmp." + self + ".0c"), "this process's, old");
  age(cache.path("k5", ".so.tmp." + self + ".0c"), 20 * 60);
  commit_entry(cache, "k6", "an entry");
  EXPECT_EQ(scan_cache(cache).temporaries, 6u);
  EXPECT_EQ(collect_stale_temporaries(cache), 4u);
  EXPECT_EQ(names_in(cache.dir()),
            (std::vector<std::string>{"k3.so.tmp." + live + ".0a", "k5.so.tmp." + self + ".0c",
                                      "k6.so", "k6.so.sum"}));
}

// NativeCompiler with a small bound: builds evict, loads mark use, temporaries of a dead
// process go on the first open, and a cache that cannot be written costs a private build.
class HygieneCompilerTest : public ::testing::Test {
 protected:
  TempDir root;
  NativeCompiler& compiler = NativeCompiler::instance();
  NativeCache cache = NativeCache::in_root(root.path.string());
};

TEST_F(HygieneCompilerTest, BuildsStayUnderTheBound) {
  uint64_t one = 0;
  {
    CompilerSetup measure(root / "measure");
    ASSERT_NE(compiler.build(kernel_source(root / "measure")).fn, nullptr);
    one = scan_cache(NativeCache::in_root(root / "measure")).total_bytes;
  }
  CompilerSetup setup(root.path.string(), "c++", 2 * one + one / 2);
  // A dead process's temporary: collected when this process first opens the cache.
  ASSERT_FALSE(cache.create());
  const std::string stale = cache.path("k", ".so.tmp." + std::to_string(dead_pid()) + ".1");
  write_file(stale, std::string(100, 'x'));
  std::vector<std::string> keys;
  for (int i = 0; i < 4; ++i) {
    const NativeResult r = compiler.build(kernel_source(root.path.string() + std::to_string(i)));
    expect_kernel_runs(r.fn);
    keys.push_back(r.key);
    if (i == 0) {
      EXPECT_FALSE(fs::exists(stale));
    }
    EXPECT_LE(scan_cache(cache).total_bytes, 2 * one + one / 2) << i;
  }
  EXPECT_EQ(compiler.stats().evictions, 2u);
  EXPECT_FALSE(fs::exists(cache.object_path(keys[0])) || fs::exists(cache.object_path(keys[1])));
  // The evicted kernels keep running in this process.
  expect_kernel_runs(compiler.build(kernel_source(root.path.string() + "0")).fn);
}

TEST_F(HygieneCompilerTest, AnUnwritableCacheCostsOnlyAPrivateBuild) {
  write_file(root / "file", "");  // a cache root below a file: nothing can be created
  CompilerSetup setup(root / "file/cache");
  ::testing::internal::CaptureStderr();
  const NativeResult r = compiler.build(kernel_source(root / "file"));
  expect_kernel_runs(r.fn);
  EXPECT_EQ(r.from, NativeResult::From::kCompiled);
  const NativeResult again = compiler.build(kernel_source(root / "file2"));
  expect_kernel_runs(again.fn);
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("cannot be written (Not a directory)"), std::string::npos) << said;
  EXPECT_EQ(said.find("cannot be written", said.find("cannot be written") + 1), std::string::npos)
      << "one warning: " << said;
  EXPECT_EQ(compiler.stats().private_builds, 2u);
  EXPECT_EQ(compiler.stats().failures, 0u);
}
