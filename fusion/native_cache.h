// The persistent tier-2 kernel cache: one folder (NEURON_CACHE_DIR/native-v1) of entries
// named by key. An entry is the kernel object (KEY.so) and its checksum (KEY.so.sum,
// written after the object, so an object without a matching checksum is never loaded),
// beside it the source (KEY.cpp), the compiler's log when a build failed (KEY.log), a
// marker that a run verified the kernel against tier 1 (KEY.ok), and a lock file
// (KEY.lock) that lets one process at a time build, check or remove the key. A disk load
// marks the entry's last use (the object's mtime) for eviction (cache_hygiene.h).
#pragma once

#include <cstdint>
#include <string>
#include <system_error>

namespace neuron::fusion {

class NativeCache {
 public:
  explicit NativeCache(std::string dir) : dir_(std::move(dir)) {}
  // The cache's folder under a cache root (NEURON_CACHE_DIR): ROOT/native-v1.
  static NativeCache in_root(const std::string& root) { return NativeCache(root + "/native-v1"); }

  const std::string& dir() const { return dir_; }
  // DIR/KEY followed by suffix (".so", ".cpp", ...).
  std::string path(const std::string& key, const std::string& suffix) const;
  std::string object_path(const std::string& key) const { return path(key, ".so"); }
  // Creates the folder (and its parents); the error, if any.
  std::error_code create() const;

  enum class Entry { kMissing, kIntact, kCorrupt };
  // kIntact when the key's object exists and matches its checksum; kCorrupt when it
  // exists otherwise (half-written, damaged, or its checksum missing).
  Entry check(const std::string& key) const;
  // Removes the key's object, checksum and verified marker (a corrupt entry, or one that
  // failed to load), so it gets rebuilt.
  void discard(const std::string& key) const;
  // Moves a freshly built object (a temporary file in this folder) to the key's object
  // path, then writes its checksum; false when either failed (the temporary is removed).
  bool commit(const std::string& key, const std::string& built) const;
  // Whether a run verified the key's kernel against tier 1 (its marker exists).
  bool verified(const std::string& key) const;
  bool mark_verified(const std::string& key) const;
  // Marks the key's last use (its object's mtime: now); nothing on a read-only disk.
  void touch(const std::string& key) const;
  // Removes the whole entry (object, checksum, marker, source, log, lock file) if its lock
  // is free now; false when another process (or this one) holds it. freed: bytes removed.
  bool remove_entry(const std::string& key, uint64_t* freed = nullptr) const;

 private:
  std::string dir_;
};

// An exclusive lock on one key across processes; released on destruction (or when the
// process dies). Its file may be removed by the holder (eviction): a process that waited
// on the removed file finds it gone and locks the one now in the folder.
class KeyLock {
 public:
  enum class Wait { kBlock, kTry };
  explicit KeyLock(const std::string& path, Wait wait = Wait::kBlock);
  ~KeyLock();
  KeyLock(const KeyLock&) = delete;
  KeyLock& operator=(const KeyLock&) = delete;
  bool held() const { return fd_ >= 0; }
  // Why it is not held: the errno of open or flock (EWOULDBLOCK: busy, under kTry).
  int error() const { return error_; }
  // Removes the lock file while holding it.
  void remove_file();

 private:
  std::string path_;
  int fd_ = -1;
  int error_ = 0;
};

}  // namespace neuron::fusion
