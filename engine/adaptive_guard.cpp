#include "engine/adaptive_guard.h"

#include <chrono>
#include <string>

#include "trace/clock.h"
#include "trace/counters.h"
#include "trace/event.h"
#include "trace/recorder.h"

namespace neuron::engine {
namespace {

using trace::steady_ns;

class TrialMarker final : public backend::WorkItem {
 public:
  TrialMarker(std::shared_ptr<TrialSpan> span, std::shared_ptr<fusion::KeyGuard> guard,
              int64_t occurrence, fusion::RunMode ran)
      : span_(std::move(span)), guard_(std::move(guard)), occurrence_(occurrence), ran_(ran) {}
  void run() override {
    const uint64_t now = steady_ns();
    if (!guard_) {
      span_->start_ns.store(now, std::memory_order_relaxed);
      return;
    }
    const uint64_t start = span_->start_ns.load(std::memory_order_relaxed);
    if (start != 0 && now >= start) guard_->add_sample(occurrence_, ran_, now - start);
  }
  std::string describe() const override { return guard_ ? "guard end marker" : "guard start marker"; }

 private:
  std::shared_ptr<TrialSpan> span_;
  std::shared_ptr<fusion::KeyGuard> guard_;  // null: the start marker
  int64_t occurrence_;
  fusion::RunMode ran_;
};

trace::Counter g_trials{"guard_trials"}, g_retrials{"guard_retrials"}, g_kept{"guard_kept"},
    g_demoted{"guard_demotions"}, g_undecided{"guard_undecided"};

}  // namespace

std::shared_ptr<TrialSpan> queue_trial_start(backend::Stream& stream) {
  auto span = std::make_shared<TrialSpan>();
  stream.enqueue(std::make_unique<TrialMarker>(span, nullptr, -1, fusion::RunMode::kFused));
  return span;
}

void queue_trial_end(backend::Stream& stream, std::shared_ptr<TrialSpan> span,
                     std::shared_ptr<fusion::KeyGuard> guard, int64_t occurrence,
                     fusion::RunMode ran) {
  stream.enqueue(std::make_unique<TrialMarker>(std::move(span), std::move(guard), occurrence, ran));
}

void emit_guard_verdict(uint64_t key, const fusion::GuardReport& report, uint8_t core) {
  if (!trace::recording()) return;
  auto& rec = trace::Recorder::instance();
  trace::Event e;
  e.time_ns = rec.now_ns();
  e.kind = static_cast<uint8_t>(trace::EventKind::kGuardVerdict);
  e.value = key;
  e.aux = report.fused_median_ns;
  e.seq = report.per_op_median_ns;
  e.op = report.pairs;
  e.reserved = report.trial;
  e.flags = static_cast<uint16_t>(report.verdict);
  e.core = core;
  rec.emit(e);
}

void count_guard_trial(bool retrial) { ++(retrial ? g_retrials : g_trials); }

void count_guard_verdict(fusion::GuardVerdict verdict) {
  if (verdict == fusion::GuardVerdict::kKeep) ++g_kept;
  else if (verdict == fusion::GuardVerdict::kDemote) ++g_demoted;
  else if (verdict == fusion::GuardVerdict::kUndecidedDemote) ++g_undecided;
}

}  // namespace neuron::engine
