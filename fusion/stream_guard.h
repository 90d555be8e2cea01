// The stream's guard: whether recording a stream pays at all. Adaptive mode records every
// op (signatures, dataflow, plans, held windows) so that hot segments can run fused; on a
// host-bound stream of small ops that costs the host more than fusion saves the device,
// and the per-key guard cannot see it (both of its arms are recorded). A stream trial
// alternates stretches whose ops pass unrecorded (as in eager mode) with recorded ones
// (adaptive, kept keys fused), in pairs of equal length with the order and the length
// drawn per pair (so a loop whose period matches the stretches cannot bias the pairs),
// times each stretch's wall time on the host (dispatch to dispatch: host work, waits at
// host reads and backpressure all count), and decides by a one-sided sign test plus a
// margin on the median ratio. Only where the unrecorded stretches win with confidence
// does the stream pass its ops unrecorded for a long period, then it is tried again; an
// undecided or lost trial keeps recording and the next trial waits twice as long.
// Only streams whose ops are cheap are tried: recording costs a microsecond or two an op.
// Not thread-safe: the host calls it under the stream's mutex.
#pragma once

#include <cstdint>
#include <vector>

namespace neuron::fusion {

struct StreamTrialSettings {
  bool enabled = true;
  uint64_t after_ops = 2048;     // recorded ops before the first trial (and its rate sample)
  double max_op_us = 50;         // only streams whose ops average less wall time are tried
  double stretch_ms = 4;         // a stretch lasts about this long (ops from the rate)
  uint32_t min_stretch_ops = 256;
  uint32_t max_stretch_ops = 16384;
  uint32_t min_pairs = 6;        // 6 of 6 wins: p = 1/64
  uint32_t max_pairs = 16;
  double alpha = 0.05;
  double margin = 0.03;          // unrecorded kept only if its median ratio <= 1 - margin
  uint64_t settled_ops = 65536;  // the first unrecorded period; doubles per settle in a row
  uint64_t settled_max_ops = uint64_t{1} << 21;
  uint64_t backoff_max_ops = uint64_t{1} << 24;  // recorded ops between trials at most
};

enum class StreamVerdict : uint8_t { kNone = 0, kSettle = 1, kRecord = 2, kUndecided = 3 };
const char* stream_verdict_name(StreamVerdict verdict);

struct StreamTrialReport {
  StreamVerdict verdict = StreamVerdict::kNone;
  uint32_t pairs = 0;
  uint32_t trial = 0;
  double ratio = 0;  // median of unrecorded / recorded wall time over the pairs
};

class StreamGuard {
 public:
  explicit StreamGuard(StreamTrialSettings settings = {}, uint64_t seed = 0);

  // A recorded op was dispatched. Returns the number of ops that should now pass
  // unrecorded (0: keep recording).
  uint64_t on_recorded_op();
  // The last op of an unrecorded stretch this guard asked for was dispatched. Returns the
  // ops of the next unrecorded stretch (0: record from the next op).
  uint64_t on_unrecorded_done();
  // Something else took over the stream (a trace, a compiled region, a new policy): the
  // trial in progress is dropped; the guard counts towards its next trial afresh.
  void abort();

  bool on_trial() const { return phase_ == Phase::kTrial; }
  bool settled() const { return phase_ == Phase::kSettled; }
  // The report of the last trial that ended (kNone before any).
  const StreamTrialReport& last_report() const { return report_; }
  uint32_t trials() const { return trial_; }

  // Same as the two calls above with the clock given (tests).
  uint64_t on_recorded_op_at(uint64_t now_ns);
  uint64_t on_unrecorded_done_at(uint64_t now_ns);

 private:
  enum class Phase : uint8_t { kCounting, kTrial, kSettled };
  struct Stretch {
    bool unrecorded = false;
    uint64_t ops = 0;
  };
  // Starts a trial at now_ns with ops of rate_ns each; returns the first stretch's
  // unrecorded ops (0: it is a recorded stretch).
  uint64_t start_trial(uint64_t now_ns, double rate_ns);
  // The current stretch ended at now_ns: store its time, decide or plan the next.
  uint64_t end_stretch(uint64_t now_ns);
  uint64_t begin_stretch(uint64_t now_ns);
  void plan_pair();
  void finish(StreamVerdict verdict, uint64_t now_ns);
  void decide();
  bool clock_needed() const;

  StreamTrialSettings settings_;
  uint64_t seed_;
  Phase phase_ = Phase::kCounting;
  uint64_t count_ = 0;        // recorded ops counted in this phase or stretch
  uint64_t threshold_;        // kCounting: ops before the next trial
  uint64_t backoff_;          // the next threshold after an undecided or lost trial
  uint64_t settle_period_;    // the next unrecorded period after a settle verdict
  uint64_t phase_start_ns_ = 0;
  uint32_t trial_ = 0;
  uint64_t stretch_ops_ = 0;  // this trial's base stretch length
  Stretch pair_[2];
  uint32_t in_pair_ = 0;      // 0 or 1: which stretch of the pair runs
  uint64_t stretch_start_ns_ = 0;
  uint64_t pair_ns_[2] = {0, 0};
  std::vector<double> ratios_;  // unrecorded / recorded per finished pair
  StreamTrialReport report_;
};

}  // namespace neuron::fusion
