#include "fusion/stream_guard.h"

#include <algorithm>

#include "fusion/guard.h"
#include "trace/clock.h"

namespace neuron::fusion {

const char* stream_verdict_name(StreamVerdict verdict) {
  switch (verdict) {
    case StreamVerdict::kNone: return "none";
    case StreamVerdict::kSettle: return "unrecorded";
    case StreamVerdict::kRecord: return "recorded";
    case StreamVerdict::kUndecided: return "undecided";
  }
  return "?";
}

StreamGuard::StreamGuard(StreamTrialSettings settings, uint64_t seed)
    : settings_(settings),
      seed_(mix64(seed + 0x5eed)),
      threshold_(std::max<uint64_t>(settings.after_ops, 2)),
      backoff_(threshold_),
      settle_period_(std::max<uint64_t>(settings.settled_ops, 1)) {}

uint64_t StreamGuard::on_recorded_op() {
  if (!settings_.enabled) return 0;
  // Only phase boundaries read the clock: a recorded op costs a count and a compare.
  switch (phase_) {
    case Phase::kCounting:
      if (count_ != 0 && count_ + 1 < threshold_) return ++count_, 0;
      break;
    case Phase::kTrial:
      if (pair_[in_pair_].unrecorded) return 0;
      if (count_ + 1 < pair_[in_pair_].ops) return ++count_, 0;
      break;
    case Phase::kSettled:
      return 0;
  }
  return on_recorded_op_at(trace::steady_ns());
}

uint64_t StreamGuard::on_unrecorded_done() {
  if (!settings_.enabled || phase_ == Phase::kCounting) return 0;
  return on_unrecorded_done_at(trace::steady_ns());
}

uint64_t StreamGuard::on_recorded_op_at(uint64_t now_ns) {
  if (!settings_.enabled) return 0;
  if (phase_ == Phase::kCounting) {
    if (count_ == 0) phase_start_ns_ = now_ns;
    if (++count_ < threshold_) return 0;
    const double rate = static_cast<double>(now_ns - phase_start_ns_) / static_cast<double>(count_ - 1);
    count_ = 0;
    // Ops this slow hide recording's microsecond: the stream is not tried (sampled again
    // after the same number of ops).
    if (rate > settings_.max_op_us * 1e3) return 0;
    return start_trial(now_ns, rate);
  }
  if (phase_ != Phase::kTrial || pair_[in_pair_].unrecorded) return 0;
  if (++count_ < pair_[in_pair_].ops) return 0;
  return end_stretch(now_ns);
}

uint64_t StreamGuard::on_unrecorded_done_at(uint64_t now_ns) {
  if (!settings_.enabled) return 0;
  if (phase_ == Phase::kTrial && pair_[in_pair_].unrecorded) return end_stretch(now_ns);
  if (phase_ != Phase::kSettled) return 0;
  // The unrecorded period ended: try again at once (the stream's rate decides whether).
  const double rate = static_cast<double>(now_ns - phase_start_ns_) /
                      static_cast<double>(std::max<uint64_t>(count_, 1));
  if (rate <= settings_.max_op_us * 1e3) return start_trial(now_ns, rate);
  phase_ = Phase::kCounting;
  count_ = 0;
  threshold_ = std::max<uint64_t>(settings_.after_ops, 2);
  settle_period_ = std::max<uint64_t>(settings_.settled_ops, 1);
  return 0;
}

void StreamGuard::abort() {
  if (phase_ == Phase::kCounting) return;
  phase_ = Phase::kCounting;
  count_ = 0;
  threshold_ = std::max<uint64_t>(settings_.after_ops, 2);
  ratios_.clear();
}

uint64_t StreamGuard::start_trial(uint64_t now_ns, double rate_ns) {
  ++trial_;
  phase_ = Phase::kTrial;
  ratios_.clear();
  const double ops = settings_.stretch_ms * 1e6 / std::max(rate_ns, 1.0);
  const double lo = std::max<uint32_t>(settings_.min_stretch_ops, 1);
  const double hi = std::max<double>(settings_.max_stretch_ops, lo);
  stretch_ops_ = static_cast<uint64_t>(std::clamp(ops, lo, hi));
  plan_pair();
  return begin_stretch(now_ns);
}

void StreamGuard::plan_pair() {
  // Order and length drawn per pair: a loop whose period is a multiple of the stretch
  // would otherwise put the same part of its body in the same arm every time.
  const uint64_t r = mix64(seed_ ^ mix64(trial_ * 0x9e3779b97f4a7c15ull + ratios_.size()));
  const bool unrecorded_first = r & 1;
  const uint64_t ops = stretch_ops_ + (r >> 1) % (stretch_ops_ / 2 + 1);
  pair_[0] = {unrecorded_first, ops};
  pair_[1] = {!unrecorded_first, ops};
  in_pair_ = 0;
}

uint64_t StreamGuard::begin_stretch(uint64_t now_ns) {
  stretch_start_ns_ = now_ns;
  count_ = 0;
  return pair_[in_pair_].unrecorded ? pair_[in_pair_].ops : 0;
}

uint64_t StreamGuard::end_stretch(uint64_t now_ns) {
  pair_ns_[in_pair_] = now_ns - stretch_start_ns_;
  if (in_pair_ == 0) {
    in_pair_ = 1;
    return begin_stretch(now_ns);
  }
  const double unrecorded = static_cast<double>(pair_[0].unrecorded ? pair_ns_[0] : pair_ns_[1]);
  const double recorded = static_cast<double>(pair_[0].unrecorded ? pair_ns_[1] : pair_ns_[0]);
  ratios_.push_back(unrecorded / std::max(recorded, 1.0));
  decide();
  if (phase_ == Phase::kTrial) {
    plan_pair();
    return begin_stretch(now_ns);
  }
  phase_start_ns_ = now_ns;
  if (phase_ == Phase::kSettled) return count_;  // the unrecorded period's ops
  return 0;
}

void StreamGuard::decide() {
  const uint32_t n = static_cast<uint32_t>(ratios_.size());
  uint32_t wins = 0;
  for (double r : ratios_) wins += r < 1.0;
  const double ratio = median_of(ratios_);
  const bool fast_enough = settings_.margin < 1.0 && ratio <= 1.0 - settings_.margin;
  StreamVerdict verdict = StreamVerdict::kNone;
  if (n >= settings_.min_pairs && sign_test_tail(n, wins) <= settings_.alpha && fast_enough)
    verdict = StreamVerdict::kSettle;
  else if (n >= settings_.min_pairs && sign_test_tail(n, n - wins) <= settings_.alpha)
    verdict = StreamVerdict::kRecord;
  else if (n >= settings_.max_pairs)
    verdict = StreamVerdict::kUndecided;
  if (verdict == StreamVerdict::kNone) return;
  report_ = {verdict, n, trial_, ratio};
  ratios_.clear();
  if (verdict == StreamVerdict::kSettle) {
    phase_ = Phase::kSettled;
    count_ = settle_period_;  // kSettled: count_ holds the period's length
    settle_period_ = std::min(settle_period_ * 2, std::max(settings_.settled_max_ops, settle_period_));
    backoff_ = std::max<uint64_t>(settings_.after_ops, 2);
    return;
  }
  phase_ = Phase::kCounting;
  count_ = 0;
  threshold_ = backoff_;
  backoff_ = std::min(backoff_ * 2, std::max(settings_.backoff_max_ops, backoff_));
  settle_period_ = std::max<uint64_t>(settings_.settled_ops, 1);
}

}  // namespace neuron::fusion
