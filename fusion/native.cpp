#include "fusion/native.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <tbb/task_group.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

extern char** environ;

namespace neuron::fusion {
namespace {

namespace fs = std::filesystem;

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

// Runs argv with stdout and stderr sent to log_path; returns the exit status (-1: could
// not start).
int run_process(const std::vector<std::string>& argv, const std::string& log_path) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return -1;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

std::string read_text(const std::string& path, size_t max_bytes = 1 << 20) {
  std::ifstream in(path, std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (s.size() > max_bytes) s = s.substr(s.size() - max_bytes);
  return s;
}

// Writes text to path atomically: a unique temporary file in the same folder, then rename.
bool write_atomic(const std::string& path, const std::string& text) {
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = path + ".tmp." + std::to_string(getpid()) + "." +
                          std::to_string(counter.fetch_add(1));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return false;
    out << text;
    out.flush();
    if (!out) {
      std::error_code ec;
      fs::remove(tmp, ec);
      return false;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::error_code ec;
    fs::remove(tmp, ec);
    return false;
  }
  return true;
}

std::string last_lines(const std::string& text, int lines) {
  size_t pos = text.size();
  for (int n = 0; n <= lines && pos != std::string::npos && pos > 0; ++n)
    pos = text.rfind('\n', pos - 1);
  return pos == std::string::npos ? text : text.substr(pos + 1);
}

// An exclusive lock on one key across processes; released on destruction (or when the
// process dies).
class KeyLock {
 public:
  explicit KeyLock(const std::string& path) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ >= 0) {
      while (::flock(fd_, LOCK_EX) != 0 && errno == EINTR) {
      }
    }
  }
  ~KeyLock() {
    if (fd_ >= 0) {
      ::flock(fd_, LOCK_UN);
      ::close(fd_);
    }
  }
  bool held() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

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

tbb::task_group& pool() {
  // Never destroyed: a build still running at exit must not block or abort the exit.
  static auto* group = new tbb::task_group();
  return *group;
}

}  // namespace

std::string file_checksum(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  char buf[1 << 16];
  uint64_t total = 0;
  while (in) {
    in.read(buf, sizeof(buf));
    const auto got = in.gcount();
    if (got > 0) {
      XXH3_64bits_update(state, buf, static_cast<size_t>(got));
      total += static_cast<uint64_t>(got);
    }
  }
  const uint64_t h = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return std::to_string(total) + ":" + hex64(h);
}

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
  const NativeOptions o = options();
  char tmpl[] = "/tmp/neuron-cxx-version-XXXXXX";
  const int fd = mkstemp(tmpl);
  std::string id = "unknown compiler " + o.compiler;
  if (fd >= 0) {
    ::close(fd);
    if (run_process({o.compiler, "--version"}, tmpl) == 0) {
      std::string text = read_text(tmpl);
      id = text.substr(0, text.find('\n'));
    }
    ::unlink(tmpl);
  }
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

NativeResult NativeCompiler::compile_to(const std::string& source, const std::string& so_path,
                                        const std::string& key) {
  NativeResult r;
  r.key = key;
  const NativeOptions o = options();
  const std::string dir = fs::path(so_path).parent_path().string();
  const std::string tag = std::to_string(getpid()) + "." + hex64(now_ns());
  const std::string src_path = dir + "/" + key + ".cpp";
  const std::string tmp_so = so_path + ".tmp." + tag;
  const std::string log_path = dir + "/" + key + ".log.tmp." + tag;
  if (!write_atomic(src_path, source)) {
    r.error = "cannot write " + src_path;
    return r;
  }
  std::vector<std::string> argv = {o.compiler};
  argv.insert(argv.end(), o.flags.begin(), o.flags.end());
  argv.insert(argv.end(), {"-shared", "-fPIC", "-o", tmp_so, src_path});
  argv.insert(argv.end(), o.link_flags.begin(), o.link_flags.end());
  const uint64_t start = now_ns();
  const int status = run_process(argv, log_path);
  r.build_ns = now_ns() - start;
  compiles_.fetch_add(1);
  std::error_code ec;
  if (status != 0) {
    const std::string log = read_text(log_path, 8192);
    fs::rename(log_path, dir + "/" + key + ".log", ec);
    fs::remove(tmp_so, ec);
    r.error = status < 0 ? "could not start the compiler '" + o.compiler + "' (NEURON_CXX)"
                         : "compiler '" + o.compiler + "' exited with status " +
                               std::to_string(status) + ": " + last_lines(log, 6);
    return r;
  }
  fs::remove(log_path, ec);
  const std::string sum = file_checksum(tmp_so);
  // The object first, then its checksum: an entry without a valid checksum is never
  // loaded, so a crash between the two renames only costs a rebuild.
  if (sum.empty() || std::rename(tmp_so.c_str(), so_path.c_str()) != 0 ||
      !write_atomic(so_path + ".sum", sum + "\n")) {
    fs::remove(tmp_so, ec);
    r.error = "cannot write the compiled kernel to " + so_path;
    return r;
  }
  r.fn = load_kernel(so_path, r.error);
  r.from = r.fn ? NativeResult::From::kCompiled : NativeResult::From::kFailed;
  return r;
}

NativeResult NativeCompiler::build_locked_on_disk(const std::string& source,
                                                  const std::string& key, bool compile) {
  const NativeOptions o = options();
  const std::string dir = o.cache_dir + "/native-v1";
  std::error_code ec;
  fs::create_directories(dir, ec);
  const std::string so_path = dir + "/" + key + ".so";
  KeyLock lock(dir + "/" + key + ".lock");
  if (!lock.held()) {
    NativeResult r;
    r.key = key;
    r.error = "cannot use the compile cache folder " + dir + " (NEURON_CACHE_DIR): " +
              (ec ? ec.message() : std::string("cannot create a lock file"));
    return r;
  }
  // Another process may have built it while we waited for the lock.
  if (fs::exists(so_path, ec)) {
    const uint64_t start = now_ns();
    const std::string want = read_text(so_path + ".sum", 256);
    const std::string have = file_checksum(so_path);
    std::string error;
    NativeKernelFn fn = nullptr;
    if (!have.empty() && want == have + "\n") fn = load_kernel(so_path, error);
    if (fn != nullptr) {
      NativeResult r;
      r.fn = fn;
      r.verified = fs::exists(dir + "/" + key + ".ok", ec);
      r.from = NativeResult::From::kDisk;
      r.key = key;
      r.build_ns = now_ns() - start;
      disk_hits_.fetch_add(1);
      return r;
    }
    // Corrupt, half-written or from a crashed writer: rebuild it.
    corrupt_.fetch_add(1);
    fs::remove(so_path, ec);
    fs::remove(so_path + ".sum", ec);
    fs::remove(dir + "/" + key + ".ok", ec);
  }
  if (!compile) {
    NativeResult r;
    r.key = key;
    r.error = "not in the cache";
    return r;
  }
  return compile_to(source, so_path, key);
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

NativeResult NativeCompiler::lookup(const std::string& source) {
  const std::string key = key_of(source);
  NativeResult r;
  if (find_in_memory(key, r)) return r;
  const std::string dir = options().cache_dir + "/native-v1/";
  std::error_code ec;
  // Only verified entries are taken without a trial; a plain stat, no lock, for misses.
  if (options().cache_dir.empty() || !fs::exists(dir + key + ".ok", ec)) {
    r.key = key;
    return r;
  }
  r = build_locked_on_disk(source, key, /*compile=*/false);
  if (r.fn != nullptr) {
    std::lock_guard lock(mutex_);
    loaded_[key] = r.fn;
    verified_[key] = verified_[key] || r.verified;
  }
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
      r = compile_to(source, std::string(tmpl) + "/" + key + ".so", key);
    }
  }
  if (r.fn != nullptr) {
    std::lock_guard lock(mutex_);
    loaded_[key] = r.fn;
    verified_[key] = verified_[key] || r.verified;
  } else {
    failures_.fetch_add(1);
  }
  return r;
}

void NativeCompiler::submit(std::string source, std::function<void(const NativeResult&)> done) {
  in_flight_.fetch_add(1);
  pool().run([this, source = std::move(source), done = std::move(done)] {
    NativeResult r;
    try {
      r = build(source);
    } catch (const std::exception& e) {
      r.error = std::string("native build failed: ") + e.what();
      failures_.fetch_add(1);
    }
    try {
      done(r);
    } catch (...) {
    }
    in_flight_.fetch_sub(1);
  });
}

void NativeCompiler::mark_verified(const std::string& key) {
  const NativeOptions o = options();
  {
    std::lock_guard lock(mutex_);
    verified_[key] = true;
  }
  if (!o.cache_dir.empty()) write_atomic(o.cache_dir + "/native-v1/" + key + ".ok", "verified\n");
}

void NativeCompiler::wait_idle() {
  while (in_flight_.load() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
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
