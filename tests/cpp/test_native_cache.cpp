// The tier-2 compile cache without torch: atomic files, the disk cache's entries
// (found again, corrupt ones refused), the per-key lock, and NativeCompiler end to end
// with the system compiler (`c++`) on a hand-written kernel.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "fusion/atomic_file.h"
#include "fusion/compiler_process.h"
#include "fusion/native.h"
#include "fusion/native_cache.h"
#include "tests/cpp/native_test_util.h"

using namespace neuron::fusion;
using namespace neuron::fusion::test_util;
namespace fs = std::filesystem;

namespace {

// A result that carries a working kernel, from where and as verified as expected.
void expect_loaded(const NativeResult& r, NativeResult::From from, bool verified) {
  ASSERT_NE(r.fn, nullptr) << r.error;
  EXPECT_EQ(r.from, from);
  EXPECT_EQ(r.verified, verified);
  expect_kernel_runs(r.fn);
}

}  // namespace

TEST(AtomicFile, WriteReplacesTheWholeFileAndLeavesNoTemporary) {
  TempDir dir;
  const std::string path = dir / "entry";
  ASSERT_TRUE(write_atomic(path, "a longer first version\n"));
  ASSERT_TRUE(write_atomic(path, "second\n"));
  EXPECT_EQ(read_text(path), "second\n");
  EXPECT_EQ(names_in(dir.path), std::vector<std::string>{"entry"});
}

TEST(AtomicFile, WriteIntoAMissingFolderFailsAndCreatesNothing) {
  TempDir dir;
  EXPECT_FALSE(write_atomic(dir / "missing/entry", "x"));
  EXPECT_TRUE(names_in(dir.path).empty());
}

TEST(AtomicFile, ReadTextKeepsTheTail) {
  TempDir dir;
  write_file(dir / "log", "abcdef");
  EXPECT_EQ(read_text(dir / "log", 3), "def");
  EXPECT_EQ(read_text(dir / "missing"), "");
}

TEST(AtomicFile, ChecksumFollowsTheBytes) {
  TempDir dir;
  EXPECT_EQ(file_checksum(dir / "missing"), "");
  write_file(dir / "a", "abcdef");
  write_file(dir / "b", "abcdef");
  write_file(dir / "c", "abcdeg");
  const std::string a = file_checksum(dir / "a");
  EXPECT_EQ(a.rfind("6:", 0), 0u) << a;  // size first
  EXPECT_EQ(a, file_checksum(dir / "b"));
  EXPECT_NE(a, file_checksum(dir / "c"));
}

TEST(NativeCache, ACommittedEntryIsFoundAgain) {
  TempDir root;
  const NativeCache cache = NativeCache::in_root(root.path.string());
  ASSERT_FALSE(cache.create());
  EXPECT_EQ(cache.dir(), root / "native-v1");
  EXPECT_EQ(cache.check("k1"), NativeCache::Entry::kMissing);
  commit_entry(cache, "k1", "object bytes");
  EXPECT_EQ(names_in(cache.dir()), (std::vector<std::string>{"k1.so", "k1.so.sum"}));
  // As another process sees it: a new cache object over the same folder.
  const NativeCache again = NativeCache::in_root(root.path.string());
  EXPECT_EQ(again.check("k1"), NativeCache::Entry::kIntact);
  EXPECT_FALSE(again.verified("k1"));
  ASSERT_TRUE(cache.mark_verified("k1"));
  EXPECT_TRUE(again.verified("k1"));
  EXPECT_EQ(again.check("k2"), NativeCache::Entry::kMissing);
}

TEST(NativeCache, ACorruptEntryIsRefusedAndDiscarded) {
  TempDir root;
  const NativeCache cache = NativeCache::in_root(root.path.string());
  ASSERT_FALSE(cache.create());
  // A damaged object (same size, one byte changed).
  commit_entry(cache, "damaged", "object bytes");
  ASSERT_TRUE(cache.mark_verified("damaged"));
  write_file(cache.object_path("damaged"), "object bytez");
  EXPECT_EQ(cache.check("damaged"), NativeCache::Entry::kCorrupt);
  cache.discard("damaged");
  EXPECT_EQ(cache.check("damaged"), NativeCache::Entry::kMissing);
  EXPECT_FALSE(cache.verified("damaged"));
  EXPECT_TRUE(names_in(cache.dir()).empty());
  // A half-written object (shorter), and one whose writer died before the checksum.
  commit_entry(cache, "short", "object bytes");
  write_file(cache.object_path("short"), "obj");
  EXPECT_EQ(cache.check("short"), NativeCache::Entry::kCorrupt);
  write_file(cache.object_path("unsummed"), "object bytes");
  EXPECT_EQ(cache.check("unsummed"), NativeCache::Entry::kCorrupt);
}

TEST(NativeCache, CommitOfAMissingObjectFails) {
  TempDir root;
  const NativeCache cache = NativeCache::in_root(root.path.string());
  ASSERT_FALSE(cache.create());
  EXPECT_FALSE(cache.commit("k", cache.object_path("k") + ".tmp.none"));
  EXPECT_EQ(cache.check("k"), NativeCache::Entry::kMissing);
}

TEST(NativeCache, KeyLockExcludesASecondHolder) {
  TempDir dir;
  auto lock = std::make_unique<KeyLock>(dir / "k.lock");
  ASSERT_TRUE(lock->held());
  std::atomic<bool> second{false};
  std::thread other([&] {
    KeyLock again(dir / "k.lock");
    second = again.held();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(second.load());  // still waiting for the first holder
  lock.reset();
  other.join();
  EXPECT_TRUE(second.load());
  EXPECT_FALSE(KeyLock(dir / "missing/k.lock").held());
}

// Each test with its own cache root, the shared compiler configured for it, and a
// kernel source of its own (so nothing comes from the memory cache of an earlier test).
class NativeCompilerTest : public ::testing::Test {
 protected:
  TempDir root;
  CompilerSetup setup{root.path.string()};
  NativeCompiler& compiler = NativeCompiler::instance();
  NativeCache cache = NativeCache::in_root(root.path.string());
  std::string source = kernel_source(root.path.string());
  std::string key = compiler.key_of(source);
};

TEST_F(NativeCompilerTest, BuildsCachesOnDiskAndFindsItAgain) {
  const NativeResult built = compiler.build(source);
  expect_loaded(built, NativeResult::From::kCompiled, false);
  EXPECT_EQ(built.key, key);
  EXPECT_EQ(cache.check(key), NativeCache::Entry::kIntact);
  EXPECT_TRUE(fs::exists(cache.path(key, ".cpp")));
  // Unverified kernels are not taken without a trial; the process keeps the loaded one.
  EXPECT_FALSE(compiler.lookup(source).verified);
  EXPECT_EQ(compiler.build(source).from, NativeResult::From::kMemory);
  compiler.mark_verified(key);
  EXPECT_TRUE(cache.verified(key));
  const NativeResult found = compiler.lookup(source);
  EXPECT_EQ(found.fn, built.fn);
  EXPECT_TRUE(found.verified);
  EXPECT_EQ(compiler.stats().compiles, 1u);
}

TEST_F(NativeCompilerTest, TakesAVerifiedKernelAnotherProcessBuilt) {
  // The other process's build: the compiler run into the cache folder, then commit.
  ASSERT_FALSE(cache.create());
  write_file(cache.path(key, ".cpp"), source);
  const std::string built = cache.object_path(key) + ".tmp.other";
  ASSERT_EQ(compile_shared_object("c++", {"-O1"}, {}, cache.path(key, ".cpp"), built,
                                  cache.path(key, ".log")), 0)
      << read_text(cache.path(key, ".log"));
  ASSERT_TRUE(cache.commit(key, built));
  ASSERT_TRUE(cache.mark_verified(key));
  expect_loaded(compiler.lookup(source), NativeResult::From::kDisk, true);
  EXPECT_EQ(compiler.stats().disk_hits, 1u);
  EXPECT_EQ(compiler.stats().compiles, 0u);
}

TEST_F(NativeCompilerTest, RefusesACorruptEntryAndRebuildsIt) {
  ASSERT_FALSE(cache.create());
  commit_entry(cache, key, "not a shared object");  // checksum matches: dlopen refuses it
  ASSERT_TRUE(cache.mark_verified(key));
  const NativeResult missed = compiler.lookup(source);
  EXPECT_EQ(missed.fn, nullptr);
  EXPECT_EQ(compiler.stats().corrupt_entries, 1u);
  EXPECT_EQ(cache.check(key), NativeCache::Entry::kMissing);  // discarded, marker too
  EXPECT_FALSE(cache.verified(key));
  expect_loaded(compiler.build(source), NativeResult::From::kCompiled, false);
  EXPECT_EQ(cache.check(key), NativeCache::Entry::kIntact);
}

TEST_F(NativeCompilerTest, SubmitRunsTheBuildInTheBackground) {
  std::atomic<bool> done{false};
  NativeKernelFn fn = nullptr;
  compiler.submit(source, [&](const NativeResult& r) {
    fn = r.fn;
    done = true;
  });
  compiler.wait_idle();
  ASSERT_TRUE(done.load());
  expect_kernel_runs(fn);
}

TEST(NativeCompiler, AFailingCompilerIsReportedNotFatal) {
  TempDir root;
  // (the compiler, what its error says)
  const std::pair<std::string, const char*> cases[] = {
      {"false", "exited with status 1"},
      {root / "no-such-compiler", "could not start the compiler"},
  };
  for (const auto& [name, says] : cases) {
    CompilerSetup setup(root.path.string(), name);
    const NativeResult r = NativeCompiler::instance().build(kernel_source(name));
    EXPECT_EQ(r.fn, nullptr) << name;
    EXPECT_NE(r.error.find(says), std::string::npos) << r.error;
    EXPECT_EQ(NativeCompiler::instance().stats().failures, 1u) << name;
    if (name == "false") {  // its (empty) output stays beside the entry
      EXPECT_TRUE(fs::exists(NativeCache::in_root(root.path.string()).path(r.key, ".log")));
    }
  }
}

TEST(CompilerProcess, LastLinesKeepsTheEnd) {
  EXPECT_EQ(last_lines("a\nb\nc\nd\n", 2), "c\nd\n");
  EXPECT_EQ(last_lines("one line", 3), "one line");
  EXPECT_EQ(last_lines("", 3), "");  // `false` as the compiler says nothing
  EXPECT_EQ(compiler_version(std::string("/no/such/compiler")), "unknown compiler /no/such/compiler");
}
