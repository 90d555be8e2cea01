// Tier 2 build service: compiles generated kernel sources with the system compiler
// (compiler_process) in the background (compile_pool), loads them with dlopen, and keeps
// them in a memory cache and a persistent disk cache (native_cache, NEURON_CACHE_DIR):
// atomic writes (atomic_file), a lock per key across processes, entries checksummed
// before they are loaded, and keys versioned by engine, torch, compiler and flags. A
// corrupt or half-written entry is rebuilt; a failing compiler is reported, never fatal.
// The cache is kept under a size bound (cache_hygiene). A cache that cannot be written
// (read-only, full) is still read; kernels are then built in a private temporary folder,
// with one warning per process.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "fusion/cache_hygiene.h"
#include "fusion/codegen.h"
#include "fusion/compile_prelude.h"
#include "fusion/link_stub.h"
#include "trace/counters.h"

namespace neuron::fusion {

class NativeCache;

struct NativeOptions {
  std::string compiler = "c++";          // NEURON_CXX
  std::vector<std::string> flags;        // optimisation, ISA and include flags
  std::vector<std::string> link_flags;   // after the source (libraries)
  std::string cache_dir;                 // persistent cache root; empty: memory only
  uint64_t cache_max_bytes = kDefaultCacheMaxBytes;  // NEURON_CACHE_MAX_BYTES
  uint64_t compile_timeout_ms = 300000;  // NEURON_COMPILE_TIMEOUT_S: a build killed after it
  std::string version;                   // engine + torch versions (part of every key)
  // The precompiled prelude (compile_prelude.h): its folder ("" : none) and the headers
  // every kernel includes first.
  std::string prelude_dir;
  std::vector<std::string> prelude_headers;
  // Libraries the kernels call that this process has loaded: kernels link against empty
  // stand-ins with their sonames (link_stub.h), run with the loaded ones; link_flags
  // when the stand-ins cannot be built. The cache key does not depend on which.
  struct StubLibrary {
    std::string soname;   // e.g. libtorch_cpu.so
    std::string run_dir;  // the real library's folder (the kernel's rpath)
  };
  std::vector<StubLibrary> stub_libraries;
};

struct NativeResult {
  NativeKernelFn fn = nullptr;
  enum class From : uint8_t { kCompiled, kDisk, kMemory, kFailed } from = From::kFailed;
  uint64_t build_ns = 0;  // compile (or load) time
  std::string key;        // the cache key (hex)
  std::string error;      // when fn is null: what failed, with the compiler's last output
  bool verified = false;  // an earlier run checked it against tier 1 and kept it
};

struct NativeStats {
  uint64_t compiles = 0, disk_hits = 0, memory_hits = 0, failures = 0, corrupt_entries = 0;
  uint64_t evictions = 0;       // entries this process evicted to keep the cache's bound
  uint64_t private_builds = 0;  // builds outside the cache (it could not be written)
};

class NativeCompiler {
 public:
  static NativeCompiler& instance();

  void configure(NativeOptions options);
  NativeOptions options() const;
  // The key of a source under the current options (hex XXH3 of source, compiler
  // identity, flags and versions).
  std::string key_of(const std::string& source);
  // Finds an already built kernel (memory, then disk) without compiling; fn is null when
  // there is none.
  NativeResult lookup(const std::string& source);
  // Finds or builds the kernel now (on the calling thread).
  NativeResult build(const std::string& source);
  // Builds on the background pool; done() runs there with the result.
  void submit(std::string source, std::function<void(const NativeResult&)> done);
  // Records that a kernel matched tier 1 and was faster: later processes (and groups)
  // swap it in without a trial.
  void mark_verified(const std::string& key);
  // Waits until every submitted build finished (tests, shutdown).
  void wait_idle();
  NativeStats stats() const;
  void reset_stats();

 private:
  NativeCompiler() = default;
  std::string compiler_identity();
  // Loads the key from the disk cache under its lock, else (compile) builds it there.
  // unusable: the cache could not be written (no lock, no space, read-only).
  NativeResult build_locked_on_disk(const std::string& source, const std::string& key,
                                    bool compile, bool& unusable);
  // The cache cannot be written: builds of this process go to a private folder from now
  // on; one warning.
  void cache_unwritable(const std::string& dir, std::string why);
  NativeResult build_privately(const std::string& source, const std::string& key);
  bool find_in_memory(const std::string& key, NativeResult& r);
  // Keeps a loaded kernel in the memory cache.
  void remember(const NativeResult& r);
  // disk_error: writing to the cache's folder failed (not the compiler).
  NativeResult compile_to(const std::string& source, const NativeCache& cache,
                          const std::string& key, bool& disk_error);

  mutable std::mutex mutex_;
  NativeOptions options_;
  std::string identity_;  // first line of `compiler --version`
  std::unordered_map<std::string, NativeKernelFn> loaded_;
  std::unordered_map<std::string, bool> verified_;
  // Registered counters (trace/counters.h), static so they are listed before the first build.
  static trace::Counter compiles_, disk_hits_, memory_hits_, failures_, corrupt_, evictions_, private_builds_;
  std::atomic<bool> cache_unwritable_{false};
  std::atomic<int64_t> in_flight_{0};
  CompilePrelude prelude_;
  LinkStubs link_stubs_;
};

}  // namespace neuron::fusion
