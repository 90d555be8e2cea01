// NativeCompiler: cache keys, the memory cache of loaded kernels, and builds through the
// disk cache (native_cache) with the system compiler (compiler_process).
#include "fusion/native.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "fusion/atomic_file.h"
#include "trace/clock.h"
#include "fusion/cache_hygiene.h"
#include "fusion/compiler_process.h"
#include "fusion/native_cache.h"
#include "trace/log.h"

namespace neuron::fusion {
namespace {

namespace fs = std::filesystem;

using trace::steady_ns;

NativeKernelFn load_kernel(const std::string& path, std::string& error) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* e = dlerror();
    error = std::string("dlopen failed: ") + (e ? e : "unknown error");
    return nullptr;
  }
  void* sym = dlsym(handle, kNativeSymbol);
  if (sym == nullptr) {
    error = std::string("no symbol ") + kNativeSymbol + " in " + path;
    dlclose(handle);
    return nullptr;
  }
  return reinterpret_cast<NativeKernelFn>(sym);
}

// Why a compiler failed for want of disk ("" if not): its output says so, or the folder it
// wrote to is (nearly) full; on a full disk the output itself may be cut short.
std::string disk_error_after_compile(const std::string& log, const std::string& dir) {
  for (int e : {ENOSPC, EDQUOT, EROFS})
    if (log.find(std::strerror(e)) != std::string::npos) return std::strerror(e);
  struct statvfs fs_stat{};
  if (::statvfs(dir.c_str(), &fs_stat) == 0 &&
      static_cast<uint64_t>(fs_stat.f_bavail) * fs_stat.f_frsize < (uint64_t{16} << 20))
    return "less than 16 MiB free";
  return "";
}

}  // namespace

NativeCompiler& NativeCompiler::instance() {
  static auto* c = new NativeCompiler();
  return *c;
}

void NativeCompiler::configure(NativeOptions options) {
  std::lock_guard lock(mutex_);
  options_ = std::move(options);
  identity_.clear();
  cache_unwritable_ = false;
}

NativeOptions NativeCompiler::options() const {
  std::lock_guard lock(mutex_);
  return options_;
}

std::string NativeCompiler::compiler_identity() {
  {
    std::lock_guard lock(mutex_);
    if (!identity_.empty()) return identity_;
  }
  const std::string id = compiler_version(options().compiler);
  std::lock_guard lock(mutex_);
  identity_ = id;
  return identity_;
}

std::string NativeCompiler::key_of(const std::string& source) {
  const std::string identity = compiler_identity();
  const NativeOptions o = options();
  std::string material = source;
  material += "\n--compiler " + o.compiler + " " + identity + "\n--flags";
  for (const auto& f : o.flags) material += " " + f;
  for (const auto& f : o.link_flags) material += " " + f;
  material += "\n--version " + o.version;
  return hex64(XXH3_64bits(material.data(), material.size()));
}

NativeResult NativeCompiler::compile_to(const std::string& source, const NativeCache& cache,
                                        const std::string& key, bool& disk_error) {
  NativeResult r;
  r.key = key;
  const NativeOptions o = options();
  const std::string tag = std::to_string(getpid()) + "." + hex64(steady_ns());
  const std::string so_path = cache.object_path(key);
  const std::string src_path = cache.path(key, ".cpp");
  const std::string tmp_so = so_path + ".tmp." + tag;
  const std::string log_path = cache.path(key, ".log.tmp." + tag);
  if (!write_atomic(src_path, source)) {
    r.error = "cannot write " + src_path;
    disk_error = true;
    return r;
  }
  // The precompiled prelude, once built, saves most of the compile (same object).
  prelude_.find(o, compiler_identity());
  std::vector<std::string> flags = o.flags;
  if (const std::string prelude = prelude_.include_path(); !prelude.empty())
    flags.insert(flags.end(), {"-include", prelude});
  const uint64_t start = steady_ns();
  const std::vector<std::string> link = link_stubs_.link_flags(o, compiler_identity());
  const int status = compile_shared_object(o.compiler, flags, link, src_path, tmp_so, log_path,
                                           o.compile_timeout_ms);
  r.build_ns = steady_ns() - start;
  compiles_.fetch_add(1);
  std::error_code ec;
  if (status != 0) {
    const std::string log = read_text(log_path, 8192);
    fs::rename(log_path, cache.path(key, ".log"), ec);
    fs::remove(tmp_so, ec);
    const std::string disk = disk_error_after_compile(log, cache.dir());
    disk_error = !disk.empty();
    if (disk_error)
      r.error = "the compiler could not write its output (" + disk + "): " + last_lines(log, 2);
    else if (status == kProcessTimedOut)
      r.error = "compiler '" + o.compiler + "' still running after " +
                std::to_string(o.compile_timeout_ms / 1000.0).substr(0, 6) +
                " s (NEURON_COMPILE_TIMEOUT_S): killed";
    else if (status < 0)
      r.error = "could not start the compiler '" + o.compiler + "' (NEURON_CXX)";
    else
      r.error = "compiler '" + o.compiler + "' exited with status " + std::to_string(status) +
                ": " + last_lines(log, 6);
    return r;
  }
  fs::remove(log_path, ec);
  if (!cache.commit(key, tmp_so)) {
    r.error = "cannot write the compiled kernel to " + so_path;
    disk_error = true;
    return r;
  }
  r.fn = load_kernel(so_path, r.error);
  r.from = r.fn ? NativeResult::From::kCompiled : NativeResult::From::kFailed;
  return r;
}

NativeResult NativeCompiler::build_locked_on_disk(const std::string& source,
                                                  const std::string& key, bool compile,
                                                  bool& unusable) {
  const NativeOptions o = options();
  const NativeCache cache = NativeCache::in_root(o.cache_dir);
  const std::error_code ec = cache.create();
  KeyLock lock(cache.path(key, ".lock"));
  if (lock.held()) open_cache_once(cache, o.cache_max_bytes);
  else cache_unwritable(cache.dir(), ec ? ec.message() : std::strerror(lock.error()));
  unusable = !lock.held();
  // Another process may have built it while we waited for the lock. Without the lock (a
  // read-only cache) an intact entry is still loaded: checksums keep half-written ones out.
  const uint64_t start = steady_ns();
  NativeResult r;
  r.key = key;
  const NativeCache::Entry entry = cache.check(key);
  if (entry != NativeCache::Entry::kMissing) {
    if (entry == NativeCache::Entry::kIntact) r.fn = load_kernel(cache.object_path(key), r.error);
    if (r.fn != nullptr) {
      if (lock.held()) cache.touch(key);  // its last use, for eviction
      r.verified = cache.verified(key);
      r.from = NativeResult::From::kDisk;
      r.build_ns = steady_ns() - start;
      disk_hits_.fetch_add(1);
      return r;
    }
    // Corrupt, half-written or from a crashed writer: rebuild it. (Without the lock it may
    // be a commit in progress.)
    if (lock.held()) {
      corrupt_.fetch_add(1);
      cache.discard(key);
    }
  }
  if (!compile || unusable) {
    r.error = unusable ? "cannot use the compile cache folder " + cache.dir() +
                             " (NEURON_CACHE_DIR)"
                       : "not in the cache";
    return r;
  }
  bool disk_error = false;
  r = compile_to(source, cache, key, disk_error);
  if (disk_error) {
    unusable = true;
    cache_unwritable(cache.dir(), r.error);
  } else {
    // Built (or its source and log kept): back under the bound, this entry kept.
    evictions_.fetch_add(evict_to_bound(cache, o.cache_max_bytes, key).evicted);
  }
  return r;
}

void NativeCompiler::cache_unwritable(const std::string& dir, std::string why) {
  if (cache_unwritable_.exchange(true)) return;
  std::replace(why.begin(), why.end(), '\n', ' ');
  while (!why.empty() && why.back() == ' ') why.pop_back();
  trace::log(trace::LogLevel::kWarn,
             "the tier-2 kernel cache " + dir + " (NEURON_CACHE_DIR) cannot be written (" + why +
                 "): this process reads it but compiles its kernels in a private temporary "
                 "folder; results are unchanged, later processes compile them again");
}

NativeResult NativeCompiler::build_privately(const std::string& source, const std::string& key) {
  NativeResult r;
  r.key = key;
  std::error_code ec;
  std::string dir = (fs::temp_directory_path(ec) / "neuron-native-XXXXXX").string();
  if (ec || mkdtemp(dir.data()) == nullptr) {
    r.error = "cannot create a temporary folder for the compiler";
    return r;
  }
  private_builds_.fetch_add(1);
  bool disk_error = false;
  r = compile_to(source, NativeCache(dir), key, disk_error);
  fs::remove_all(dir, ec);  // a loaded kernel stays mapped
  return r;
}

bool NativeCompiler::find_in_memory(const std::string& key, NativeResult& r) {
  std::lock_guard lock(mutex_);
  auto it = loaded_.find(key);
  if (it == loaded_.end()) return false;
  memory_hits_.fetch_add(1);
  r.fn = it->second;
  r.from = NativeResult::From::kMemory;
  r.key = key;
  r.verified = verified_[key];
  return true;
}

void NativeCompiler::remember(const NativeResult& r) {
  std::lock_guard lock(mutex_);
  loaded_[r.key] = r.fn;
  verified_[r.key] = verified_[r.key] || r.verified;
}

NativeResult NativeCompiler::lookup(const std::string& source) {
  const std::string key = key_of(source);
  NativeResult r;
  if (find_in_memory(key, r)) return r;
  const std::string root = options().cache_dir;
  // Only verified entries are taken without a trial; a plain stat, no lock, for misses.
  if (root.empty() || !NativeCache::in_root(root).verified(key)) {
    r.key = key;
    return r;
  }
  bool unusable = false;
  r = build_locked_on_disk(source, key, /*compile=*/false, unusable);
  if (r.fn != nullptr) remember(r);
  return r;
}

NativeResult NativeCompiler::build(const std::string& source) {
  const std::string key = key_of(source);
  NativeResult r;
  if (find_in_memory(key, r)) return r;
  const NativeOptions o = options();
  // No persistent cache, or one that cannot be written: a private temporary folder.
  bool unusable = o.cache_dir.empty();
  if (!unusable)
    r = build_locked_on_disk(source, key, /*compile=*/!cache_unwritable_.load(), unusable);
  if (r.fn == nullptr && (unusable || cache_unwritable_.load())) r = build_privately(source, key);
  if (r.fn != nullptr)
    remember(r);
  else
    failures_.fetch_add(1);
  return r;
}

void NativeCompiler::mark_verified(const std::string& key) {
  const NativeOptions o = options();
  {
    std::lock_guard lock(mutex_);
    verified_[key] = true;
  }
  if (!o.cache_dir.empty()) NativeCache::in_root(o.cache_dir).mark_verified(key);
}

trace::Counter NativeCompiler::compiles_{"native_compiles"}, NativeCompiler::disk_hits_{"native_disk_hits"},
    NativeCompiler::memory_hits_{"native_memory_hits"}, NativeCompiler::failures_{"native_compile_failures"},
    NativeCompiler::corrupt_{"native_corrupt_entries"}, NativeCompiler::evictions_{"native_cache_evictions"},
    NativeCompiler::private_builds_{"native_private_builds"};

NativeStats NativeCompiler::stats() const {
  NativeStats s;
  s.compiles = compiles_;
  s.disk_hits = disk_hits_;
  s.memory_hits = memory_hits_;
  s.failures = failures_;
  s.corrupt_entries = corrupt_;
  s.evictions = evictions_;
  s.private_builds = private_builds_;
  return s;
}

void NativeCompiler::reset_stats() {
  for (trace::Counter* c : {&compiles_, &disk_hits_, &memory_hits_, &failures_, &corrupt_, &evictions_,
                            &private_builds_})
    c->reset();
}

}  // namespace neuron::fusion
