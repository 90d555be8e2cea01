#include "engine/config.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <thread>
#include <vector>

#include "trace/log.h"

namespace neuron::engine {
namespace {

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

std::string bad(const char* name, const std::string& value, const std::string& allowed) {
  return std::string(name) + "='" + value + "' is not valid: expected " + allowed;
}

bool parse_int(const std::string& text, long long& out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  out = std::strtoll(text.c_str(), &end, 10);
  return errno == 0 && end != nullptr && *end == '\0' && std::isdigit(text[0]);
}

// "0-1,3": the number of distinct cores listed, each below machine_cores.
bool parse_visible_cores(const std::string& text, int machine_cores, int& count) {
  std::vector<bool> seen(static_cast<size_t>(machine_cores), false);
  count = 0;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    const std::string item = text.substr(pos, comma - pos);
    const size_t dash = item.find('-');
    long long first = 0, last = 0;
    if (!parse_int(item.substr(0, dash), first)) return false;
    if (dash == std::string::npos) last = first;
    else if (!parse_int(item.substr(dash + 1), last)) return false;
    if (first > last || last >= machine_cores) return false;
    for (long long k = first; k <= last; ++k) {
      if (seen[static_cast<size_t>(k)]) return false;
      seen[static_cast<size_t>(k)] = true;
      ++count;
    }
    pos = comma + 1;
  }
  return count > 0;
}

// CPUs this process may run on (its affinity mask).
int usable_cpus() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0) return CPU_COUNT(&allowed);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// NEURON_SYNC_YIELD_US when unset: 20 ms while every process on the machine (torchrun's
// LOCAL_WORLD_SIZE, 1 when unset) can have two CPUs, else 0. A yielding wait keeps its
// core awake for a fast wake-up, but on a shared core it takes time from the other ranks
// (4 ranks on 2 CPUs, TP x FSDP2: 0.68x of CPU/Gloo's step time with yielding, 1.00x without).
int64_t default_sync_yield_us(const std::optional<std::string>& local_world_size, int cpus) {
  long long local = 1;
  if (local_world_size && (!parse_int(*local_world_size, local) || local < 1)) local = 1;
  // Each process keeps a host thread and a worker busy: yielding pays while that leaves
  // cores idle, and takes them from the other processes when it does not.
  return local * 2 <= cpus ? 20000 : 0;
}

}  // namespace

std::string trace_path_for_process(const std::string& path, const std::optional<std::string>& rank,
                                   const std::optional<std::string>& world_size) {
  const std::string r = rank.value_or("0");
  std::string out;
  bool named_rank = false;
  for (size_t i = 0; i < path.size();) {
    if (path.compare(i, 6, "{rank}") == 0) {
      out += r;
      named_rank = true;
      i += 6;
    } else if (path.compare(i, 5, "{pid}") == 0) {
      out += std::to_string(::getpid());
      i += 5;
    } else {
      out += path[i++];
    }
  }
  long long world = 1;
  if (named_rank || !rank || !world_size || !parse_int(*world_size, world) || world <= 1) return out;
  // One file per rank: ranks of one job writing the same file would corrupt it.
  const size_t slash = out.rfind('/');
  const size_t dot = out.rfind('.');
  const size_t at = dot != std::string::npos && (slash == std::string::npos || dot > slash + 1) ? dot : out.size();
  return out.substr(0, at) + ".rank" + r + out.substr(at);
}

const char* mode_name(Mode mode) { return mode == Mode::kAdaptive ? "adaptive" : "eager"; }

bool parse_mode(const std::string& text, Mode& out) {
  if (text == "eager") {
    out = Mode::kEager;
    return true;
  }
  if (text == "adaptive") {
    out = Mode::kAdaptive;
    return true;
  }
  return false;
}

bool parse_bytes(const std::string& text, size_t& out) {
  size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
  if (i == 0 || i > 15) return false;
  unsigned long long value = std::strtoull(text.substr(0, i).c_str(), nullptr, 10);
  std::string suffix = text.substr(i);
  for (char& c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  unsigned shift = 0;
  if (suffix.empty() || suffix == "B") shift = 0;
  else if (suffix == "K" || suffix == "KB" || suffix == "KIB") shift = 10;
  else if (suffix == "M" || suffix == "MB" || suffix == "MIB") shift = 20;
  else if (suffix == "G" || suffix == "GB" || suffix == "GIB") shift = 30;
  else if (suffix == "T" || suffix == "TB" || suffix == "TIB") shift = 40;
  else return false;
  out = static_cast<size_t>(value) << shift;
  return true;
}

std::optional<Config> config_from_env(std::string& error) {
  Config c;
  if (auto v = env("NEURON_EAGER_MODE")) {
    if (!parse_mode(*v, c.mode)) {
      error = bad("NEURON_EAGER_MODE", *v, "one of: eager, adaptive");
      return std::nullopt;
    }
  }
  if (auto v = env("NEURON_LAUNCH_BLOCKING")) {
    if (*v != "0" && *v != "1") {
      error = bad("NEURON_LAUNCH_BLOCKING", *v, "0 or 1");
      return std::nullopt;
    }
    c.launch_blocking = *v == "1";
  }
  if (auto v = env("NEURON_CORES")) {
    long long n = 0;
    if (!parse_int(*v, n) || n < 1 || n > 64) {
      error = bad("NEURON_CORES", *v, "an integer from 1 to 64");
      return std::nullopt;
    }
    c.cores = static_cast<int>(n);
  }
  // TorchNeuron's visibility variable (accelerate sets it per rank): the process sees only
  // the listed cores of the NEURON_CORES the machine has, as neuron:0, neuron:1, ...
  if (auto v = env("NEURON_RT_VISIBLE_CORES")) {
    int visible = 0;
    if (!parse_visible_cores(*v, c.cores, visible)) {
      error = bad("NEURON_RT_VISIBLE_CORES", *v,
                  "core indices below NEURON_CORES (" + std::to_string(c.cores) +
                      "), each once, as a comma-separated list of indices or first-last ranges, e.g. 0-1 or 2,3");
      return std::nullopt;
    }
    c.cores = visible;
  }
  if (auto v = env("NEURON_HBM_BYTES")) {
    size_t n = 0;
    if (!parse_bytes(*v, n) || n < (size_t{1} << 20) || n > (size_t{1} << 40)) {
      error = bad("NEURON_HBM_BYTES", *v,
                  "a byte count from 1MiB to 1TiB, as digits with an optional K, M, G or T "
                  "suffix (binary units), e.g. 4G");
      return std::nullopt;
    }
    c.hbm_bytes = n;
  }
  if (auto v = env("NEURON_LOG_LEVEL")) {
    trace::LogLevel level;
    if (!trace::parse_log_level(*v, level)) {
      error = bad("NEURON_LOG_LEVEL", *v,
                  "one of: trace, debug, info, warn, error, critical, off");
      return std::nullopt;
    }
    c.log_level = *v;
  }
  if (auto v = env("NEURON_WORKER_THREADS")) {
    long long n = 0;
    if (!parse_int(*v, n) || n < 1 || n > 1024) {
      error = bad("NEURON_WORKER_THREADS", *v, "an integer from 1 to 1024");
      return std::nullopt;
    }
    c.worker_threads = static_cast<int>(n);
  }
  if (auto v = env("NEURON_SYNC_YIELD_US")) {
    long long n = 0;
    if (!parse_int(*v, n) || n < 0 || n > 1000000) {
      error = bad("NEURON_SYNC_YIELD_US", *v, "an integer from 0 to 1000000 (microseconds)");
      return std::nullopt;
    }
    c.sync_yield_us = n;
  } else {
    c.sync_yield_us = default_sync_yield_us(env("LOCAL_WORLD_SIZE"), usable_cpus());
  }
  if (auto v = env("NEURON_PIN_WORKERS")) {
    if (*v != "0" && *v != "1") {
      error = bad("NEURON_PIN_WORKERS", *v, "0 or 1");
      return std::nullopt;
    }
    c.pin_workers = *v == "1";
  }
  if (auto v = env("LOCAL_RANK")) {  // torchrun's: not ours to reject, only to use
    long long n = 0;
    if (parse_int(*v, n) && n >= 0 && n < (1 << 20)) c.local_rank = static_cast<int>(n);
  }
  if (auto v = env("NEURON_TRACE")) c.trace_path = trace_path_for_process(*v, env("RANK"), env("WORLD_SIZE"));
  if (auto v = env("NEURON_FUSION_POLICY")) c.policy_path = *v;
  if (auto v = env("NEURON_NUMERICS")) {
    if (*v != "exact" && *v != "fast") {
      error = bad("NEURON_NUMERICS", *v, "exact (results bit-equal to CPU eager) or fast (README: numerics)");
      return std::nullopt;
    }
    c.fast_numerics = *v == "fast";
  }
  if (auto v = env("NEURON_CACHE_DIR")) {
    if (v->empty()) {
      error = bad("NEURON_CACHE_DIR", *v, "a folder path (created if missing)");
      return std::nullopt;
    }
    c.cache_dir = *v;
  }
  if (auto v = env("NEURON_CACHE_MAX_BYTES")) {
    size_t n = 0;
    if (!parse_bytes(*v, n) || n < (size_t{64} << 10) || n > (size_t{1} << 40)) {
      error = bad("NEURON_CACHE_MAX_BYTES", *v,
                  "a byte count from 64K to 1T, as digits with an optional K, M, G or T "
                  "suffix (binary units), e.g. 2G");
      return std::nullopt;
    }
    c.cache_max_bytes = n;
  }
  if (auto v = env("NEURON_COMPILE_TIMEOUT_S")) {
    char* end = nullptr;
    const double s = std::strtod(v->c_str(), &end);
    if (v->empty() || end == nullptr || *end != '\0' || !(s >= 0.1 && s <= 86400)) {
      error = bad("NEURON_COMPILE_TIMEOUT_S", *v,
                  "seconds from 0.1 to 86400 a tier-2 kernel build may take before it is "
                  "killed (the kernel's group stays on tier 1), e.g. 120");
      return std::nullopt;
    }
    c.compile_timeout_ms = static_cast<uint64_t>(s * 1000);
  }
  if (auto v = env("NEURON_CXX")) {
    if (v->empty() || v->find_first_of(" \t\n") != std::string::npos) {
      error = bad("NEURON_CXX", *v, "a C++ compiler command without spaces (a name on PATH or a path), e.g. g++");
      return std::nullopt;
    }
    c.cxx = *v;
  }
  return c;
}

}  // namespace neuron::engine
