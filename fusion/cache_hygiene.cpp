#include "fusion/cache_hygiene.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <ctime>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>

namespace neuron::fusion {
namespace {

namespace fs = std::filesystem;

int64_t mtime_ns(const struct stat& st) {
  return int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
}

int64_t now_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

// The writer's pid of a temporary NAME.tmp.PID.TAG (NAME.tmp.PID); 0 when the name has
// no pid (or is not a temporary).
pid_t temporary_pid(const std::string& name) {
  const size_t at = name.find(".tmp.");
  if (at == std::string::npos) return 0;
  pid_t pid = 0;
  for (size_t i = at + 5; i < name.size() && i < at + 14 && name[i] >= '0' && name[i] <= '9'; ++i)
    pid = pid * 10 + (name[i] - '0');
  return pid;
}

bool is_temporary(const std::string& name) { return name.find(".tmp.") != std::string::npos; }

bool process_gone(pid_t pid) { return pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH; }

// One eviction (or clear) at a time per folder, so that each scans what the one before
// left and processes evicting together do not each remove the same excess.
std::string eviction_lock_path(const NativeCache& cache) { return cache.dir() + "/.evict.lock"; }

// Calls f(name, stat) for each plain file in the folder.
template <typename F>
void for_each_file(const std::string& dir, F&& f) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.empty() || name[0] == '.') continue;  // the eviction lock
    struct stat st{};
    if (::lstat(it->path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    f(name, st);
  }
}

}  // namespace

CacheUsage scan_cache(const NativeCache& cache) {
  CacheUsage usage;
  std::map<std::string, CacheEntryInfo> by_key;
  std::map<std::string, int64_t> object_mtime;
  for_each_file(cache.dir(), [&](const std::string& name, const struct stat& st) {
    const auto bytes = static_cast<uint64_t>(st.st_size);
    usage.total_bytes += bytes;
    if (is_temporary(name)) {
      ++usage.temporaries;
      usage.temporary_bytes += bytes;
      return;
    }
    const std::string key = name.substr(0, name.find('.'));
    const std::string suffix = name.substr(key.size());
    CacheEntryInfo& e = by_key[key];
    e.key = key;
    e.bytes += bytes;
    e.last_use_ns = std::max(e.last_use_ns, mtime_ns(st));
    if (suffix == ".so") {
      e.has_object = true;
      object_mtime[key] = mtime_ns(st);
    }
    if (suffix == ".ok") e.verified = true;
  });
  for (auto& [key, e] : by_key) {
    // A kernel's last use is its last load (or build); its marker and checksum may be newer.
    if (auto it = object_mtime.find(key); it != object_mtime.end()) e.last_use_ns = it->second;
    usage.entries.push_back(std::move(e));
  }
  return usage;
}

size_t collect_stale_temporaries(const NativeCache& cache, std::chrono::seconds max_age) {
  const int64_t oldest = now_ns() - std::chrono::nanoseconds(max_age).count();
  const pid_t self = ::getpid();
  size_t removed = 0;
  for_each_file(cache.dir(), [&](const std::string& name, const struct stat& st) {
    if (!is_temporary(name)) return;
    const pid_t pid = temporary_pid(name);
    if (pid == self || (!process_gone(pid) && mtime_ns(st) >= oldest)) return;
    if (::unlink(cache.path(name, "").c_str()) == 0) ++removed;
  });
  return removed;
}

Eviction evict_to_bound(const NativeCache& cache, uint64_t max_bytes, const std::string& keep) {
  KeyLock one_at_a_time(eviction_lock_path(cache));
  CacheUsage usage = scan_cache(cache);
  Eviction r;
  r.bytes_before = r.bytes_after = usage.total_bytes;
  if (usage.total_bytes <= max_bytes) return r;
  const uint64_t target = max_bytes / 8 * kEvictToEighths;
  std::sort(usage.entries.begin(), usage.entries.end(),
            [](const CacheEntryInfo& a, const CacheEntryInfo& b) {
              return a.last_use_ns != b.last_use_ns ? a.last_use_ns < b.last_use_ns : a.key < b.key;
            });
  for (const CacheEntryInfo& e : usage.entries) {
    if (r.bytes_after <= target) break;
    if (e.key == keep) continue;
    uint64_t freed = 0;
    if (!cache.remove_entry(e.key, &freed)) {
      ++r.busy;
      continue;
    }
    if (freed == 0) continue;  // gone already (cleared), or only its lock file was left
    ++r.evicted;
    r.bytes_after -= std::min(freed, r.bytes_after);
  }
  return r;
}

void open_cache_once(const NativeCache& cache, uint64_t max_bytes) {
  static std::mutex mutex;
  static std::set<std::string> opened;
  {
    std::lock_guard lock(mutex);
    if (!opened.insert(cache.dir()).second) return;
  }
  collect_stale_temporaries(cache);
  evict_to_bound(cache, max_bytes);
}

Cleared clear_cache(const NativeCache& cache) {
  KeyLock one_at_a_time(eviction_lock_path(cache));
  Cleared r;
  r.temporaries = collect_stale_temporaries(cache);
  for (const CacheEntryInfo& e : scan_cache(cache).entries) {
    if (cache.remove_entry(e.key))
      ++r.removed;
    else
      ++r.busy;
  }
  if (r.busy == 0) one_at_a_time.remove_file();  // an empty folder
  return r;
}

}  // namespace neuron::fusion
