#include <gtest/gtest.h>

#include "fusion/guard.h"
#include "fusion/policy.h"
#include "trace/segment_state.h"
#include "trace/trace_cache.h"

using namespace neuron;
using fusion::GuardVerdict;
using fusion::KeyGuard;
using fusion::RunMode;

namespace {

// Runs a trial where fused occurrences take fused_ns and per-op ones per_op_ns (plus a
// deterministic wobble) until a verdict; returns it.
fusion::GuardReport run_trial(KeyGuard& g, uint64_t fused_ns, uint64_t per_op_ns, int limit = 200,
                              uint64_t wobble = 0) {
  for (int i = 0; i < limit; ++i) {
    const RunMode mode = g.next_mode();
    const int64_t occ = g.end_occurrence();
    const uint64_t w = wobble * static_cast<uint64_t>((i * 7919) % 13) / 13;
    g.add_sample(occ, mode, (mode == RunMode::kFused ? fused_ns : per_op_ns) + w);
    auto r = g.poll(static_cast<uint64_t>(i));
    if (r.verdict != GuardVerdict::kNone) return r;
  }
  return {};
}

}  // namespace

TEST(Guard, AMarginOfOneKeepsNothing) {
  fusion::GuardSettings s;
  s.margin = 1.0;
  KeyGuard g(7, s);
  g.start_trial();
  auto r = run_trial(g, 1, 1000000);  // fused a million times faster: still not kept
  EXPECT_NE(r.verdict, GuardVerdict::kKeep);
  EXPECT_NE(r.verdict, GuardVerdict::kNone);
  EXPECT_EQ(g.next_mode(), RunMode::kPerOp);
}

TEST(Guard, SignTestTail) {
  EXPECT_DOUBLE_EQ(fusion::sign_test_tail(6, 6), 1.0 / 64);
  EXPECT_DOUBLE_EQ(fusion::sign_test_tail(6, 5), 7.0 / 64);
  EXPECT_DOUBLE_EQ(fusion::sign_test_tail(4, 0), 1.0);
  EXPECT_DOUBLE_EQ(fusion::sign_test_tail(3, 4), 0.0);
}

TEST(Guard, EachPairRunsBothModes) {
  for (uint32_t trial = 1; trial < 4; ++trial) {
    int fused_first = 0;
    for (int64_t p = 0; p < 64; ++p) {
      const RunMode a = KeyGuard::planned(0x1234, trial, 2 * p), b = KeyGuard::planned(0x1234, trial, 2 * p + 1);
      EXPECT_NE(a, b);
      fused_first += a == RunMode::kFused;
    }
    EXPECT_GT(fused_first, 10);  // the order varies from pair to pair
    EXPECT_LT(fused_first, 54);
  }
}

TEST(Guard, KeepsAProgramThatWins) {
  KeyGuard g(7, fusion::GuardSettings{});
  g.start_trial();
  auto r = run_trial(g, 600, 1000, 200, 50);
  EXPECT_EQ(r.verdict, GuardVerdict::kKeep);
  EXPECT_GE(r.pairs, fusion::GuardSettings{}.min_pairs);
  EXPECT_NEAR(r.ratio, 0.6, 0.06);
  EXPECT_EQ(g.next_mode(), RunMode::kFused);
  EXPECT_FALSE(g.retry_due(1000000));  // kept programs are not re-tried
}

TEST(Guard, DemotesALoserEarlyAndRetriesWithBackoff) {
  fusion::GuardSettings s;
  s.retry_after = 100;
  s.retry_max = 300;
  KeyGuard g(9, s);
  g.start_trial();
  auto r = run_trial(g, 3000, 1000);
  EXPECT_EQ(r.verdict, GuardVerdict::kDemote);
  EXPECT_EQ(r.pairs, s.early_pairs);  // a clear loss needs no more pairs
  EXPECT_EQ(g.next_mode(), RunMode::kPerOp);
  EXPECT_FALSE(g.retry_due(50));
  EXPECT_TRUE(g.retry_due(200));  // verdict near occurrence 4, + 100
  g.start_trial();
  EXPECT_EQ(run_trial(g, 3000, 1000).verdict, GuardVerdict::kDemote);
  EXPECT_EQ(g.last_report().trial, 2u);
  EXPECT_FALSE(g.retry_due(150));  // the backoff doubled
  EXPECT_TRUE(g.retry_due(210));
  g.start_trial();
  run_trial(g, 3000, 1000);
  EXPECT_FALSE(g.retry_due(300));  // capped at retry_max
  EXPECT_TRUE(g.retry_due(305));
}

TEST(Guard, ATieNeverKeepsTheProgram) {
  KeyGuard g(11, fusion::GuardSettings{});
  g.start_trial();
  auto r = run_trial(g, 1000, 1000, 500, 100);
  EXPECT_TRUE(r.verdict == GuardVerdict::kUndecidedDemote || r.verdict == GuardVerdict::kDemote);
  EXPECT_EQ(g.next_mode(), RunMode::kPerOp);
}

TEST(Guard, OccurrencesThatRanAnotherModeDoNotCount) {
  KeyGuard g(13, fusion::GuardSettings{});
  g.start_trial();
  for (int i = 0; i < 40; ++i) {
    const RunMode planned = g.next_mode();
    const int64_t occ = g.end_occurrence();
    // Every fused turn diverged and ran per op: no valid pair, ever.
    g.add_sample(occ, RunMode::kPerOp, planned == RunMode::kFused ? 10 : 1000);
    EXPECT_EQ(g.poll(static_cast<uint64_t>(i)).verdict, GuardVerdict::kNone);
  }
  auto r = run_trial(g, 10, 1000, 200);  // then they match: a clear win
  EXPECT_EQ(r.verdict, GuardVerdict::kKeep);
}

TEST(Guard, SamplesMayArriveLate) {
  KeyGuard g(15, fusion::GuardSettings{});
  g.start_trial();
  std::vector<std::pair<int64_t, RunMode>> pending;
  for (int i = 0; i < 20; ++i) {
    pending.emplace_back(0, g.next_mode());
    pending.back().first = g.end_occurrence();
    EXPECT_EQ(g.poll(0).verdict, GuardVerdict::kNone);  // nothing measured yet
  }
  for (auto [occ, mode] : pending) g.add_sample(occ, mode, mode == RunMode::kFused ? 100 : 1000);
  EXPECT_EQ(g.poll(20).verdict, GuardVerdict::kKeep);
}

TEST(Guard, PolicyKnobsAreCheckedAndNamed) {
  fusion::Policy p;
  std::string error;
  EXPECT_TRUE(fusion::set_policy_value(p, "guard", "false", error));
  EXPECT_FALSE(p.guard.enabled);
  EXPECT_TRUE(fusion::set_policy_value(p, "guard_min_pairs", "8", error));
  EXPECT_EQ(p.guard.min_pairs, 8u);
  EXPECT_FALSE(fusion::set_policy_value(p, "guard", "maybe", error));
  EXPECT_NE(error.find("guard"), std::string::npos);
  EXPECT_NE(error.find("true or false"), std::string::npos);
  EXPECT_FALSE(fusion::set_policy_value(p, "guard_alpha", "0.9", error));
  EXPECT_NE(error.find("0.0001..0.5"), std::string::npos);
  EXPECT_FALSE(fusion::set_policy_value(p, "guard_min_pairs", "0", error));
  EXPECT_FALSE(fusion::set_policy_value(p, "guard_margin", "-1", error));
  auto parsed = fusion::parse_policy("guard = off\nguard_retry_after = 10\n", "test", error);
  ASSERT_TRUE(parsed.has_value());
  EXPECT_FALSE(parsed->guard.enabled);
  EXPECT_EQ(parsed->guard.retry_after, 10u);
  EXPECT_NE(fusion::policy_json(p).find("\"guard_min_pairs\":8"), std::string::npos);
}

TEST(SegmentStateMachine, AllowsTheLifeCycleOnly) {
  using S = trace::SegmentState;
  EXPECT_TRUE(trace::transition_allowed(S::kCold, S::kHot));
  EXPECT_TRUE(trace::transition_allowed(S::kHot, S::kOnTrial));
  EXPECT_TRUE(trace::transition_allowed(S::kOnTrial, S::kDemoted));
  EXPECT_TRUE(trace::transition_allowed(S::kDemoted, S::kOnTrial));
  EXPECT_TRUE(trace::transition_allowed(S::kOnTrial, S::kReadyTier1));
  EXPECT_TRUE(trace::transition_allowed(S::kReadyTier1, S::kReadyTier2));
  EXPECT_TRUE(trace::transition_allowed(S::kReadyTier2, S::kBlacklisted));
  EXPECT_FALSE(trace::transition_allowed(S::kCold, S::kReadyTier1));
  EXPECT_FALSE(trace::transition_allowed(S::kBlacklisted, S::kOnTrial));
  EXPECT_FALSE(trace::transition_allowed(S::kReadyTier2, S::kReadyTier1));
  EXPECT_FALSE(trace::transition_allowed(S::kDemoted, S::kReadyTier1));
  EXPECT_STREQ(trace::state_name(S::kOnTrial), "on_trial");
}

TEST(SegmentStateMachine, TraceCacheRefusesIllegalMovesAndCountsThem) {
  trace::TraceCache cache(2);
  trace::Segment s;
  s.key = 42;
  s.length = 1;
  s.words = {1, 2, 3};
  cache.observe(s, 1);
  EXPECT_FALSE(cache.transition(42, trace::SegmentState::kOnTrial));  // still cold
  cache.observe(s, 2);
  EXPECT_EQ(cache.state(42), trace::SegmentState::kHot);
  EXPECT_TRUE(cache.transition(42, trace::SegmentState::kOnTrial));
  EXPECT_TRUE(cache.transition(42, trace::SegmentState::kDemoted));
  EXPECT_FALSE(cache.transition(42, trace::SegmentState::kReadyTier2));
  auto st = cache.stats();
  EXPECT_EQ(st.illegal_transitions, 2u);
  EXPECT_EQ(st.transitions[static_cast<size_t>(trace::SegmentState::kOnTrial)]
                          [static_cast<size_t>(trace::SegmentState::kDemoted)],
            1u);
}
