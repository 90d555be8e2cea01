#include "fusion/native_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>

#include "fusion/atomic_file.h"

namespace neuron::fusion {

namespace fs = std::filesystem;

std::string NativeCache::path(const std::string& key, const std::string& suffix) const {
  return dir_ + "/" + key + suffix;
}

std::error_code NativeCache::create() const {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  return ec;
}

NativeCache::Entry NativeCache::check(const std::string& key) const {
  const std::string so_path = object_path(key);
  std::error_code ec;
  if (!fs::exists(so_path, ec)) return Entry::kMissing;
  const std::string want = read_text(so_path + ".sum", 256);
  const std::string have = file_checksum(so_path);
  return !have.empty() && want == have + "\n" ? Entry::kIntact : Entry::kCorrupt;
}

void NativeCache::discard(const std::string& key) const {
  std::error_code ec;
  fs::remove(object_path(key), ec);
  fs::remove(object_path(key) + ".sum", ec);
  fs::remove(path(key, ".ok"), ec);
}

bool NativeCache::commit(const std::string& key, const std::string& built) const {
  const std::string so_path = object_path(key);
  const std::string sum = file_checksum(built);
  // The object first, then its checksum: an entry without a valid checksum is never
  // loaded, so a crash between the two renames only costs a rebuild.
  if (sum.empty() || std::rename(built.c_str(), so_path.c_str()) != 0 ||
      !write_atomic(so_path + ".sum", sum + "\n")) {
    std::error_code ec;
    fs::remove(built, ec);
    return false;
  }
  return true;
}

bool NativeCache::verified(const std::string& key) const {
  std::error_code ec;
  return fs::exists(path(key, ".ok"), ec);
}

bool NativeCache::mark_verified(const std::string& key) const {
  return write_atomic(path(key, ".ok"), "verified\n");
}

KeyLock::KeyLock(const std::string& path) {
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ >= 0) {
    while (::flock(fd_, LOCK_EX) != 0 && errno == EINTR) {
    }
  }
}

KeyLock::~KeyLock() {
  if (fd_ >= 0) {
    ::flock(fd_, LOCK_UN);
    ::close(fd_);
  }
}

}  // namespace neuron::fusion
