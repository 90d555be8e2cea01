// Files that other processes may read while this one writes them: whole-file writes
// through a temporary and a rename, bounded reads, and a checksum of a file's bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace neuron::fusion {

// Writes text to path atomically: a unique temporary file in the same folder, then
// rename. A reader sees the old file or the whole new one; false when it failed (the
// temporary is removed).
bool write_atomic(const std::string& path, const std::string& text);
// A file's bytes, only the last max_bytes of a longer one; empty when it cannot be read.
std::string read_text(const std::string& path, size_t max_bytes = 1 << 20);
// Checksum of a file's bytes (its size and XXH3, hex); empty when it cannot be read.
std::string file_checksum(const std::string& path);
// 16 hex digits (cache keys, checksums, file name tags).
std::string hex64(uint64_t v);

}  // namespace neuron::fusion
