#include "fusion/atomic_file.h"

#include <unistd.h>
#include <xxhash.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace neuron::fusion {

namespace fs = std::filesystem;

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string read_text(const std::string& path, size_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (s.size() > max_bytes) s = s.substr(s.size() - max_bytes);
  return s;
}

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

}  // namespace neuron::fusion
