#include "fusion/verdict_store.h"

#include <xxhash.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "fusion/atomic_file.h"

namespace neuron::fusion {

VerdictStore::VerdictStore(const std::string& root, const std::string& context) {
  if (root.empty()) return;
  dir_ = root + "/verdicts-v1/" + hex64(XXH3_64bits(context.data(), context.size()));
}

std::string VerdictStore::format(const StoredVerdict& v) {
  char ratio[32];
  std::snprintf(ratio, sizeof ratio, "%.6g", v.ratio);
  return std::string(verdict_name(v.verdict)) + " " + ratio + "\n";
}

std::optional<StoredVerdict> VerdictStore::parse(const std::string& text) {
  const size_t space = text.find(' ');
  if (space == std::string::npos) return std::nullopt;
  const std::string name = text.substr(0, space);
  StoredVerdict v;
  for (GuardVerdict g : {GuardVerdict::kKeep, GuardVerdict::kDemote, GuardVerdict::kUndecidedDemote})
    if (name == verdict_name(g)) v.verdict = g;
  if (v.verdict == GuardVerdict::kNone) return std::nullopt;
  const std::string number = text.substr(space + 1);
  char* end = nullptr;
  v.ratio = std::strtod(number.c_str(), &end);
  if (end == number.c_str() || (*end != '\n' && *end != '\0') || !std::isfinite(v.ratio) || v.ratio < 0)
    return std::nullopt;
  return v;
}

std::optional<StoredVerdict> VerdictStore::load(uint64_t guard_key) const {
  if (dir_.empty()) return std::nullopt;
  const std::string text = read_text(dir_ + "/" + hex64(guard_key), 256);
  if (text.empty()) return std::nullopt;
  return parse(text);
}

bool VerdictStore::store(uint64_t guard_key, const GuardReport& report) const {
  if (dir_.empty() || report.verdict == GuardVerdict::kNone) return false;
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) return false;
  return write_atomic(dir_ + "/" + hex64(guard_key), format({report.verdict, report.ratio}));
}

void VerdictStore::forget(uint64_t guard_key) const {
  if (dir_.empty()) return;
  std::error_code ec;
  std::filesystem::remove(dir_ + "/" + hex64(guard_key), ec);
}

}  // namespace neuron::fusion
