#include "fusion/guard.h"

#include <algorithm>
#include <cmath>

namespace neuron::fusion {
namespace {

constexpr int64_t kUnknown = -1, kInvalid = -2;

}  // namespace

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

uint64_t mix64(uint64_t x) {  // splitmix64's finaliser
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

const char* verdict_name(GuardVerdict verdict) {
  switch (verdict) {
    case GuardVerdict::kNone: return "none";
    case GuardVerdict::kKeep: return "kept";
    case GuardVerdict::kDemote: return "demoted";
    case GuardVerdict::kUndecidedDemote: return "undecided";
  }
  return "?";
}

double sign_test_tail(uint32_t n, uint32_t k) {
  if (k == 0) return 1.0;
  if (k > n) return 0.0;
  double tail = 0, c = 1;  // C(n, j) built up incrementally
  for (uint32_t j = 0; j <= n; ++j) {
    if (j >= k) tail += c;
    c = c * (n - j) / (j + 1);
  }
  return tail / std::ldexp(1.0, static_cast<int>(n));
}

KeyGuard::KeyGuard(uint64_t key, GuardSettings settings) : key_(key), settings_(settings) {}

RunMode KeyGuard::planned(uint64_t key, uint32_t trial, int64_t occurrence) {
  const uint64_t pair = static_cast<uint64_t>(occurrence) / 2;
  const bool fused_first = mix64(key ^ mix64(trial * 0x9e3779b97f4a7c15ull + pair)) & 1;
  const bool first = occurrence % 2 == 0;
  return first == fused_first ? RunMode::kFused : RunMode::kPerOp;
}

bool KeyGuard::on_trial() const {
  std::lock_guard lock(mutex_);
  return on_trial_;
}

void KeyGuard::start_trial() {
  std::lock_guard lock(mutex_);
  on_trial_ = true;
  ++trial_;
  next_occurrence_ = 0;
  spans_.clear();
}

int64_t KeyGuard::end_occurrence() {
  std::lock_guard lock(mutex_);
  if (!on_trial_) return -1;
  spans_.push_back(kUnknown);
  return next_occurrence_++;
}

RunMode KeyGuard::next_mode() const {
  std::lock_guard lock(mutex_);
  return on_trial_ ? planned(key_, trial_, next_occurrence_) : kept_;
}

void KeyGuard::add_sample(int64_t occurrence, RunMode ran, uint64_t span_ns) {
  std::lock_guard lock(mutex_);
  if (!on_trial_ || occurrence < 0 || static_cast<size_t>(occurrence) >= spans_.size()) return;
  spans_[static_cast<size_t>(occurrence)] =
      ran == planned(key_, trial_, occurrence) ? static_cast<int64_t>(span_ns) : kInvalid;
}

void KeyGuard::discard(int64_t occurrence) {
  std::lock_guard lock(mutex_);
  if (on_trial_ && occurrence >= 0 && static_cast<size_t>(occurrence) < spans_.size())
    spans_[static_cast<size_t>(occurrence)] = kInvalid;
}

GuardReport KeyGuard::decide_locked() {
  GuardReport r;
  r.trial = trial_;
  std::vector<double> ratios, fused, per_op;
  uint32_t wins = 0, invalid = 0;
  bool all_early_losses = true;
  for (size_t p = 0; p + 1 < spans_.size(); p += 2) {
    const int64_t a = spans_[p], b = spans_[p + 1];
    if (a == kUnknown || b == kUnknown) break;  // samples arrive in order
    if (a == kInvalid || b == kInvalid) {
      ++invalid;
      continue;
    }
    const bool a_fused = planned(key_, trial_, static_cast<int64_t>(p)) == RunMode::kFused;
    const double f = static_cast<double>(a_fused ? a : b), q = static_cast<double>(a_fused ? b : a);
    const double ratio = f / std::max(q, 1.0);
    ratios.push_back(ratio);
    fused.push_back(f);
    per_op.push_back(q);
    if (ratio < 1.0) ++wins;
    if (ratios.size() <= settings_.early_pairs && ratio <= settings_.early_loss) all_early_losses = false;
  }
  const uint32_t n = static_cast<uint32_t>(ratios.size());
  r.pairs = n;
  r.ratio = median_of(ratios);
  r.fused_median_ns = static_cast<uint64_t>(median_of(fused));
  r.per_op_median_ns = static_cast<uint64_t>(median_of(per_op));
  const bool fast_enough = settings_.margin < 1.0 && r.ratio <= 1.0 - settings_.margin;
  if (n >= settings_.early_pairs && all_early_losses) r.verdict = GuardVerdict::kDemote;
  else if (n >= settings_.min_pairs && sign_test_tail(n, wins) <= settings_.alpha && fast_enough)
    r.verdict = GuardVerdict::kKeep;
  else if (n >= settings_.min_pairs && sign_test_tail(n, n - wins) <= settings_.alpha)
    r.verdict = GuardVerdict::kDemote;
  else if (n >= settings_.max_pairs)
    r.verdict = fast_enough ? GuardVerdict::kKeep : GuardVerdict::kUndecidedDemote;
  else if (invalid > settings_.max_pairs)  // the fused path keeps diverging: nothing to gain
    r.verdict = GuardVerdict::kUndecidedDemote;
  return r;
}

GuardReport KeyGuard::poll(uint64_t occurrences_seen) {
  std::lock_guard lock(mutex_);
  if (!on_trial_) return GuardReport{};
  GuardReport r = decide_locked();
  if (r.verdict == GuardVerdict::kNone) return r;
  on_trial_ = false;
  spans_.clear();
  report_ = r;
  if (r.verdict == GuardVerdict::kKeep) {
    kept_ = RunMode::kFused;
    backoff_ = 0;
  } else {
    kept_ = RunMode::kPerOp;
    backoff_ = backoff_ == 0 ? settings_.retry_after : std::min(backoff_ * 2, settings_.retry_max);
    retry_at_ = occurrences_seen + backoff_;
  }
  return r;
}

void KeyGuard::seed(GuardVerdict verdict, double ratio) {
  std::lock_guard lock(mutex_);
  if (on_trial_ || trial_ > 0 || verdict == GuardVerdict::kNone) return;
  trial_ = 1;
  report_ = GuardReport{};
  report_.verdict = verdict;
  report_.trial = 1;
  report_.ratio = ratio;
  if (verdict == GuardVerdict::kKeep) {
    kept_ = RunMode::kFused;
    backoff_ = 0;
  } else {
    kept_ = RunMode::kPerOp;
    backoff_ = settings_.retry_after;
    retry_at_ = backoff_;
  }
}

bool KeyGuard::retry_due(uint64_t occurrences_seen) const {
  std::lock_guard lock(mutex_);
  return !on_trial_ && kept_ == RunMode::kPerOp && backoff_ > 0 && occurrences_seen >= retry_at_;
}

GuardReport KeyGuard::last_report() const {
  std::lock_guard lock(mutex_);
  return report_;
}

}  // namespace neuron::fusion
