// The online guard: a hot key's fused program must beat the same key run per op, measured
// on the key's real occurrences. A trial alternates the two modes in pairs (the order in
// each pair drawn from the key's hash), takes each occurrence's device span (from the
// moment the device could start its first op to the end of its last: host hold time and
// device time both count) and decides by a one-sided sign test over the pairs plus a
// margin on the median ratio. A program that does not win is demoted and re-tried later,
// with backoff. Thread-safe: workers add samples, host threads plan and poll.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

namespace neuron::fusion {

struct GuardSettings {
  bool enabled = true;
  uint32_t min_pairs = 6;          // pairs before a verdict (6 of 6 wins: p = 1/64)
  uint32_t max_pairs = 24;         // undecided by then: per op (it never loses)
  double alpha = 0.05;             // sign test: one-sided p-value needed for a verdict
  double margin = 0.03;            // fused kept only if its median ratio <= 1 - margin
  uint32_t early_pairs = 2;        // this many pairs all slower by early_loss: demote at once
  double early_loss = 1.25;
  uint64_t retry_after = 256;      // occurrences before a demoted key's first re-trial
  uint64_t retry_max = 65536;      // the backoff doubles up to this
  // Keys that differ only in shapes, scalars or dtypes (trace::Segment::family: a batch
  // size that changes, a KV cache that grows) share one trial and its verdict: their
  // occurrences pair up as one key's would, so a family of 48 shapes each seen every 48
  // steps is judged in a dozen steps instead of hundreds, and a shape seen for the first
  // time starts with its family's verdict.
  bool share_family = true;
  // Demotions are kept in the cache folder (fusion/verdict_store.h); a guard that finds its
  // key's starts per op instead of a trial (engine/guard_memory.cpp).
  bool remember = true;
};

enum class RunMode : uint8_t { kFused = 0, kPerOp = 1 };

enum class GuardVerdict : uint8_t { kNone = 0, kKeep = 1, kDemote = 2, kUndecidedDemote = 3 };
const char* verdict_name(GuardVerdict verdict);

struct GuardReport {
  GuardVerdict verdict = GuardVerdict::kNone;
  uint32_t pairs = 0;           // valid pairs compared
  uint32_t trial = 0;           // 1: first trial, 2+: re-trials
  uint64_t fused_median_ns = 0;
  uint64_t per_op_median_ns = 0;
  double ratio = 0;             // median of fused / per-op over the pairs
};

// One-sided sign test: P(X >= k) for X ~ Binomial(n, 1/2).
double sign_test_tail(uint32_t n, uint32_t k);
// The median of v (0 when empty), and splitmix64's finaliser (a trial's draws): shared
// with the stream trial (fusion/stream_guard.h).
double median_of(std::vector<double> v);
uint64_t mix64(uint64_t x);

class KeyGuard {
 public:
  KeyGuard(uint64_t key, GuardSettings settings);

  bool on_trial() const;
  uint64_t key() const { return key_; }
  // Starts a trial (the first, or a re-trial after a demotion).
  void start_trial();
  // Starts from a verdict measured before (fusion/verdict_store.h) instead of a trial: as
  // if the first trial had ended with it now (a demoted key's first re-trial comes after
  // retry_after occurrences). A guard on trial or with a verdict is left alone.
  void seed(GuardVerdict verdict, double ratio);
  // Host, at the key's cut: the index of the occurrence that just ended (its sample will
  // name it), then the mode the next occurrence runs in. Outside a trial: -1 / the kept mode.
  int64_t end_occurrence();
  RunMode next_mode() const;
  // Worker: an occurrence's device span, and whether it ran the mode planned for it.
  void add_sample(int64_t occurrence, RunMode ran, uint64_t span_ns);
  // An occurrence that was not timed: its pair does not count.
  void discard(int64_t occurrence);
  // Host: a verdict once the samples allow one (kNone while the trial goes on). A verdict
  // ends the trial; after a demotion, retry_due(count) says when to try again (the key's
  // occurrence count at the verdict plus a backoff that doubles per demotion).
  GuardReport poll(uint64_t occurrences_seen);
  bool retry_due(uint64_t occurrences_seen) const;
  GuardReport last_report() const;

  // The planned mode of occurrence i of trial t (exposed for tests).
  static RunMode planned(uint64_t key, uint32_t trial, int64_t occurrence);

 private:
  GuardReport decide_locked();

  const uint64_t key_;
  const GuardSettings settings_;
  mutable std::mutex mutex_;
  bool on_trial_ = false;
  RunMode kept_ = RunMode::kPerOp;
  uint32_t trial_ = 0;
  int64_t next_occurrence_ = 0;
  uint64_t retry_at_ = 0, backoff_ = 0;
  std::vector<int64_t> spans_;  // per occurrence of the trial: span ns, -1 unknown, -2 invalid
  GuardReport report_;
};

}  // namespace neuron::fusion
