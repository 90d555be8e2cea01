// The persistent tier-2 kernel cache: one folder (NEURON_CACHE_DIR/native-v1) of entries
// named by key. An entry is the kernel object (KEY.so) and its checksum (KEY.so.sum,
// written after the object, so an object without a matching checksum is never loaded),
// beside it the source (KEY.cpp), the compiler's log when a build failed (KEY.log), a
// marker that a run verified the kernel against tier 1 (KEY.ok), and a lock file
// (KEY.lock) that lets one process at a time build or check the key.
#pragma once

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

 private:
  std::string dir_;
};

// An exclusive lock on one key across processes; released on destruction (or when the
// process dies).
class KeyLock {
 public:
  explicit KeyLock(const std::string& path);
  ~KeyLock();
  KeyLock(const KeyLock&) = delete;
  KeyLock& operator=(const KeyLock&) = delete;
  bool held() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

}  // namespace neuron::fusion
