#include "fusion/native_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
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

void NativeCache::touch(const std::string& key) const {
  ::utimensat(AT_FDCWD, object_path(key).c_str(), nullptr, 0);
}

bool NativeCache::remove_entry(const std::string& key, uint64_t* freed) const {
  KeyLock lock(path(key, ".lock"), KeyLock::Wait::kTry);
  if (!lock.held()) return false;
  uint64_t bytes = 0;
  for (const char* suffix : {".ok", ".so.sum", ".so", ".cpp", ".log"}) {
    const std::string file = path(key, suffix);
    struct stat st{};
    if (::stat(file.c_str(), &st) == 0 && ::unlink(file.c_str()) == 0)
      bytes += static_cast<uint64_t>(st.st_size);
  }
  lock.remove_file();
  if (freed != nullptr) *freed = bytes;
  return true;
}

KeyLock::KeyLock(const std::string& path, Wait wait) : path_(path) {
  const int op = wait == Wait::kTry ? LOCK_EX | LOCK_NB : LOCK_EX;
  for (;;) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      error_ = errno;
      return;
    }
    int rc = 0;
    while ((rc = ::flock(fd_, op)) != 0 && errno == EINTR) {
    }
    if (rc != 0) {
      error_ = errno;
      ::close(fd_);
      fd_ = -1;
      return;
    }
    // Held; but if the holder before us removed the file, the lock guards nothing: the
    // next process would create and lock a new file. Lock the file now in the folder.
    struct stat held{}, named{};
    if (::fstat(fd_, &held) == 0 && ::stat(path.c_str(), &named) == 0 &&
        held.st_dev == named.st_dev && held.st_ino == named.st_ino)
      return;
    ::close(fd_);
    fd_ = -1;
  }
}

void KeyLock::remove_file() {
  if (fd_ >= 0) ::unlink(path_.c_str());
}

KeyLock::~KeyLock() {
  if (fd_ >= 0) {
    ::flock(fd_, LOCK_UN);
    ::close(fd_);
  }
}

}  // namespace neuron::fusion
