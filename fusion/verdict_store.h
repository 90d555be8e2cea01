// Guard verdicts kept on disk beside the tier-2 kernels: a process that finds a key's
// verdict (kept or demoted, and the ratio it was measured at) starts the key in that mode
// instead of trying it again. One small file per key, in a folder per context (the policy
// and the machine the verdicts were measured under). A demoted key is still re-tried with
// backoff, and a missing, unreadable or malformed file just means "no verdict".
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "fusion/guard.h"

namespace neuron::fusion {

struct StoredVerdict {
  GuardVerdict verdict = GuardVerdict::kNone;
  double ratio = 0;  // fused / per op, as measured
};

class VerdictStore {
 public:
  // root: the cache root (NEURON_CACHE_DIR's resolved folder; empty: nothing is kept).
  // context: the text the verdicts depend on (policy knobs, thread count); hashed.
  VerdictStore(const std::string& root, const std::string& context);
  bool enabled() const { return !dir_.empty(); }
  const std::string& dir() const { return dir_; }
  std::optional<StoredVerdict> load(uint64_t guard_key) const;
  // Keeps a final verdict (kKeep, kDemote, kUndecidedDemote); false when it was not written.
  bool store(uint64_t guard_key, const GuardReport& report) const;
  // Drops a key's verdict, if any.
  void forget(uint64_t guard_key) const;

  // The file's text for a verdict, and back (nullopt: malformed).
  static std::string format(const StoredVerdict& v);
  static std::optional<StoredVerdict> parse(const std::string& text);

 private:
  std::string dir_;
};

}  // namespace neuron::fusion
