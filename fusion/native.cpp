// NativeCompiler: cache keys, the memory cache of loaded kernels, and builds through the
// disk cache (native_cache) with the system compiler (compiler_process).
#include "fusion/native.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>
#include <xxhash.h>

#include <chrono>
#include <filesystem>

#include "fusion/atomic_file.h"
#include "fusion/compiler_process.h"
#include "fusion/native_cache.h"

namespace neuron::fusion {
namespace {

namespace fs = std::filesystem;

uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

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

}  // namespace

NativeCompiler& NativeCompiler::instance() {
  static auto* c = new NativeCompiler();
  return *c;
}

void NativeCompiler::configure(NativeOptions options) {
  std::lock_guard lock(mutex_);
  options_ = std::move(options);
  identity_.clear();
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
                                        const std::string& key) {
  NativeResult r;
  r.key = key;
  const NativeOptions o = options();
  const std::string tag = std::to_string(getpid()) + "." + hex64(now_ns());
  const std::string so_path = cache.object_path(key);
  const std::string src_path = cache.path(key, ".cpp");
  const std::string tmp_so = so_path + ".tmp." + tag;
  const std::string log_path = cache.path(key, ".log.tmp." + tag);
  if (!write_atomic(src_path, source)) {
    r.error = "cannot write " + src_path;
    return r;
  }
  // The precompiled prelude, once built, saves most of the compile (same object).
  std::vector<std::string> flags = o.flags;
  if (const std::string prelude = prelude_.include_path(); !prelude.empty())
    flags.insert(flags.end(), {"-include", prelude});
  const uint64_t start = now_ns();
  const int status = compile_shared_object(o.compiler, flags, o.link_flags, src_path, tmp_so, log_path);
  r.build_ns = now_ns() - start;
  compiles_.fetch_add(1);
  std::error_code ec;
  if (status != 0) {
    const std::string log = read_text(log_path, 8192);
    fs::rename(log_path, cache.path(key, ".log"), ec);
    fs::remove(tmp_so, ec);
    r.error = status < 0 ? "could not start the compiler '" + o.compiler + "' (NEURON_CXX)"
                         : "compiler '" + o.compiler + "' exited with status " +
                               std::to_string(status) + ": " + last_lines(log, 6);
    return r;
  }
  fs::remove(log_path, ec);
  if (!cache.commit(key, tmp_so)) {
    r.error = "cannot write the compiled kernel to " + so_path;
    return r;
  }
  r.fn = load_kernel(so_path, r.error);
  r.from = r.fn ? NativeResult::From::kCompiled : NativeResult::From::kFailed;
  return r;
}

NativeResult NativeCompiler::build_locked_on_disk(const std::string& source,
                                                  const std::string& key, bool compile) {
  const NativeCache cache = NativeCache::in_root(options().cache_dir);
  const std::error_code ec = cache.create();
  KeyLock lock(cache.path(key, ".lock"));
  if (!lock.held()) {
    NativeResult r;
    r.key = key;
    r.error = "cannot use the compile cache folder " + cache.dir() + " (NEURON_CACHE_DIR): " +
              (ec ? ec.message() : std::string("cannot create a lock file"));
    return r;
  }
  // Another process may have built it while we waited for the lock.
  const uint64_t start = now_ns();
  const NativeCache::Entry entry = cache.check(key);
  if (entry != NativeCache::Entry::kMissing) {
    std::string error;
    NativeKernelFn fn = nullptr;
    if (entry == NativeCache::Entry::kIntact) fn = load_kernel(cache.object_path(key), error);
    if (fn != nullptr) {
      NativeResult r;
      r.fn = fn;
      r.verified = cache.verified(key);
      r.from = NativeResult::From::kDisk;
      r.key = key;
      r.build_ns = now_ns() - start;
      disk_hits_.fetch_add(1);
      return r;
    }
    // Corrupt, half-written or from a crashed writer: rebuild it.
    corrupt_.fetch_add(1);
    cache.discard(key);
  }
  if (!compile) {
    NativeResult r;
    r.key = key;
    r.error = "not in the cache";
    return r;
  }
  return compile_to(source, cache, key);
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
  r = build_locked_on_disk(source, key, /*compile=*/false);
  if (r.fn != nullptr) remember(r);
  return r;
}

NativeResult NativeCompiler::build(const std::string& source) {
  const std::string key = key_of(source);
  NativeResult r;
  if (find_in_memory(key, r)) return r;
  if (!options().cache_dir.empty()) {
    r = build_locked_on_disk(source, key, /*compile=*/true);
  } else {
    // No persistent cache: a private temporary folder.
    char tmpl[] = "/tmp/neuron-native-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      r.key = key;
      r.error = "cannot create a temporary folder for the compiler";
    } else {
      r = compile_to(source, NativeCache(tmpl), key);
    }
  }
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

NativeStats NativeCompiler::stats() const {
  NativeStats s;
  s.compiles = compiles_;
  s.disk_hits = disk_hits_;
  s.memory_hits = memory_hits_;
  s.failures = failures_;
  s.corrupt_entries = corrupt_;
  return s;
}

void NativeCompiler::reset_stats() {
  for (auto* c : {&compiles_, &disk_hits_, &memory_hits_, &failures_, &corrupt_}) c->store(0);
}

}  // namespace neuron::fusion
