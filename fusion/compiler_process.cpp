#include "fusion/compiler_process.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "fusion/atomic_file.h"

extern char** environ;

namespace {
// How long a build runs at nice 19 before its priority rises (run_process).
constexpr std::chrono::milliseconds kEscalateAfter{1000};

// Compilers running now (their process groups) and the files they write. A process that
// exits with a build in flight (builds run in the background and never hold up an exit)
// kills them and removes those files: otherwise the compiler would finish on its own and
// leave its temporaries in the cache folder for good.
struct Running {
  pid_t group;
  std::vector<std::string> files;
};

std::mutex& running_mutex() {
  static auto* m = new std::mutex();  // never destroyed: used by the exit handler
  return *m;
}

std::vector<Running>& running() {
  static auto* r = new std::vector<Running>();
  return *r;
}

// Set by the exit handler: a build thread whose compiler it killed must not go on into a
// process whose statics are being destroyed; it parks until the process is gone.
std::atomic<bool> exiting{false};

void stop_running_builds() {
  exiting.store(true);
  std::lock_guard lock(running_mutex());
  for (const Running& r : running()) kill(-r.group, SIGKILL);
  for (const Running& r : running()) {
    // The build thread may reap it first (then ECHILD at once).
    while (waitpid(r.group, nullptr, 0) < 0 && errno == EINTR) {
    }
    for (const auto& f : r.files) ::unlink(f.c_str());
  }
  running().clear();
}

std::atomic<int> g_children{0};

void note_running(pid_t group, std::vector<std::string> files) {
  g_children.fetch_add(1, std::memory_order_relaxed);
  static std::once_flag once;
  std::call_once(once, [] { std::atexit(stop_running_builds); });
  std::lock_guard lock(running_mutex());
  running().push_back({group, std::move(files)});
}

void note_finished(pid_t group) {
  {
    std::lock_guard lock(running_mutex());
    auto& r = running();
    r.erase(std::remove_if(r.begin(), r.end(), [&](const Running& x) { return x.group == group; }),
            r.end());
  }
  g_children.fetch_sub(1, std::memory_order_relaxed);
  while (exiting.load()) ::pause();
}
}  // namespace

namespace neuron::fusion {

bool children_running() { return g_children.load(std::memory_order_relaxed) > 0; }

int run_process(const std::vector<std::string>& argv, const std::string& log_path,
                uint64_t timeout_ms, const std::vector<std::string>& outputs) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  // The compiler is background work and runs under SCHED_IDLE (inherited by everything
  // the driver starts): it gets a core only when no thread of ours wants one, and any of
  // ours that wakes takes the core back at once. Nice values were not enough on 2 cores:
  // a busy loop at nice 10 next to neuron eager made a worker team's parallel ops wait
  // at their barriers for the core it held (1.8 -> 4.0 ms per iteration; nice 19: 3.4;
  // SCHED_IDLE: 2.0, while the loop still got 70% of a core from idle time).
  // Spawned from a thread of its own that first puts itself in the idle class: the
  // child inherits the spawning thread's policy (glibc's posix_spawn attributes take
  // only SCHED_OTHER, FIFO and RR), and no thread of ours stays in it.
  pid_t pid = 0;
  bool idle_class = false;
  int rc = 0;
  std::thread([&] {
    sched_param param{};
    param.sched_priority = 0;
    idle_class = sched_setscheduler(0, SCHED_IDLE, &param) == 0;
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    // Its own process group: the driver and the cc1plus, as and ld it starts are killed
    // (and, without the idle class, reprioritised) together.
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attr, 0);
    rc = posix_spawnp(&pid, args[0], &actions, &attr, args.data(), environ);
    posix_spawnattr_destroy(&attr);
  }).join();
  if (rc != 0) pid = 0;
  posix_spawn_file_actions_destroy(&actions);
  if (pid == 0) return -1;
  std::vector<std::string> files = outputs;
  files.push_back(log_path);
  note_running(pid, std::move(files));
  struct Finished {
    pid_t group;
    ~Finished() { note_finished(group); }
  } finished{pid};
  // Where SCHED_IDLE is refused, the lowest nice value instead; but at nice 19 a build
  // gets ~1.5% of a core while the host and a worker keep both busy (a 0.5 s compile
  // took half a minute), so once it has run kEscalateAfter the group goes to nice 10.
  if (!idle_class) setpriority(PRIO_PGRP, static_cast<id_t>(pid), 19);
  const auto start = std::chrono::steady_clock::now();
  bool escalated = false;  // never, for an idle-class build
  int status = 0;
  for (;;) {
    const bool poll = (!idle_class && !escalated) || timeout_ms != 0;
    const pid_t done = waitpid(pid, &status, poll ? WNOHANG : 0);
    if (done == pid) break;
    if (done < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    const auto ran = std::chrono::steady_clock::now() - start;
    if (timeout_ms != 0 && ran >= std::chrono::milliseconds(timeout_ms)) {
      // A hung compiler (or one that would take longer than any kernel is worth): the
      // driver and everything it started go, and the key stays on tier 1.
      kill(-pid, SIGKILL);
      while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      return kProcessTimedOut;
    }
    if (!idle_class && !escalated && ran >= kEscalateAfter) {
      setpriority(PRIO_PGRP, static_cast<id_t>(pid), 10);
      escalated = true;
      continue;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(escalated ? 50 : 10));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

std::string compiler_version(const std::string& compiler) {
  char tmpl[] = "/tmp/neuron-cxx-version-XXXXXX";
  const int fd = mkstemp(tmpl);
  std::string id = "unknown compiler " + compiler;
  if (fd >= 0) {
    ::close(fd);
    if (run_process({compiler, "--version"}, tmpl, 30000) == 0) {
      std::string text = read_text(tmpl);
      id = text.substr(0, text.find('\n'));
    }
    ::unlink(tmpl);
  }
  return id;
}

int compile_shared_object(const std::string& compiler, const std::vector<std::string>& flags,
                          const std::vector<std::string>& link_flags,
                          const std::string& source_path, const std::string& out_path,
                          const std::string& log_path, uint64_t timeout_ms) {
  std::vector<std::string> argv = {compiler};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.insert(argv.end(), {"-shared", "-fPIC", "-o", out_path, source_path});
  argv.insert(argv.end(), link_flags.begin(), link_flags.end());
  return run_process(argv, log_path, timeout_ms, {out_path});
}

std::string last_lines(const std::string& text, int lines) {
  if (text.empty()) return text;  // a compiler that failed without a word
  size_t pos = text.size();
  for (int n = 0; n <= lines && pos != std::string::npos && pos > 0; ++n)
    pos = text.rfind('\n', pos - 1);
  return pos == std::string::npos ? text : text.substr(pos + 1);
}

}  // namespace neuron::fusion
