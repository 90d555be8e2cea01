#include <gtest/gtest.h>

#include "fusion/policy.h"
#include "fusion/stream_guard.h"

using namespace neuron;
using fusion::StreamGuard;
using fusion::StreamTrialSettings;
using fusion::StreamVerdict;

namespace {

// A simulated stream: every op takes recorded_ns when recorded and unrecorded_ns when it
// passes unrecorded (plus a deterministic wobble). Drives the guard for `ops` ops and
// returns how many of them passed unrecorded.
struct Sim {
  StreamGuard& g;
  uint64_t recorded_ns, unrecorded_ns, wobble = 0;
  uint64_t now = 1000, unrecorded_left = 0, unrecorded_ops = 0, recorded_ops = 0;

  uint64_t cost(uint64_t base, uint64_t i) const { return base + wobble * ((i * 7919) % 13) / 13; }
  void run(uint64_t ops) {
    for (uint64_t i = 0; i < ops; ++i) {
      if (unrecorded_left > 0) {
        now += cost(unrecorded_ns, i);
        ++unrecorded_ops;
        if (--unrecorded_left == 0) unrecorded_left = g.on_unrecorded_done_at(now);
      } else {
        now += cost(recorded_ns, i);
        ++recorded_ops;
        unrecorded_left = g.on_recorded_op_at(now);
      }
    }
  }
};

StreamTrialSettings quick() {
  StreamTrialSettings s;
  s.after_ops = 1000;
  s.stretch_ms = 0.5;  // 500 us: 250 ops of 2 us
  s.settled_ops = 5000;
  return s;
}

}  // namespace

TEST(StreamGuard, UnrecordedWinsWhenRecordingCostsMoreThanItSaves) {
  StreamGuard g(quick(), 1);
  Sim sim{g, 2400, 2000};  // recording costs 20% and saves nothing
  sim.run(20000);
  EXPECT_GE(g.trials(), 1u);
  EXPECT_EQ(g.last_report().verdict, StreamVerdict::kSettle);
  EXPECT_LT(g.last_report().ratio, 0.97);
  EXPECT_GE(g.last_report().pairs, 6u);
  // Most ops after the verdict pass unrecorded, a trial's recorded halves aside.
  EXPECT_GT(sim.unrecorded_ops, sim.recorded_ops);
}

TEST(StreamGuard, RecordingKeptWhenFusionPays) {
  StreamGuard g(quick(), 2);
  Sim sim{g, 1500, 2000};  // recorded (fused) ops are faster
  sim.run(20000);
  EXPECT_EQ(g.last_report().verdict, StreamVerdict::kRecord);
  // After the verdict the stream records; the next trial waits twice as long.
  const uint64_t unrecorded_after_first = sim.unrecorded_ops;
  sim.run(1900);
  EXPECT_EQ(sim.unrecorded_ops, unrecorded_after_first);
}

TEST(StreamGuard, EqualArmsWithNoiseAreUndecidedAndKeepRecording) {
  StreamTrialSettings s = quick();
  StreamGuard g(s, 3);
  Sim sim{g, 2000, 2000, 400};
  sim.run(60000);
  ASSERT_NE(g.last_report().verdict, StreamVerdict::kNone);
  EXPECT_NE(g.last_report().verdict, StreamVerdict::kSettle);
}

TEST(StreamGuard, SlowOpsAreNeverTried) {
  StreamTrialSettings s = quick();
  s.max_op_us = 50;
  StreamGuard g(s, 4);
  Sim sim{g, 80000, 40000};  // 80 us ops: recording's cost is noise there
  sim.run(5000);
  EXPECT_EQ(g.trials(), 0u);
  EXPECT_EQ(sim.unrecorded_ops, 0u);
}

TEST(StreamGuard, DisabledNeverAsks) {
  StreamTrialSettings s = quick();
  s.enabled = false;
  StreamGuard g(s, 5);
  Sim sim{g, 2400, 2000};
  sim.run(20000);
  EXPECT_EQ(g.trials(), 0u);
  EXPECT_EQ(sim.unrecorded_ops, 0u);
}

TEST(StreamGuard, SettledStreamsAreTriedAgainAndFollowAChange) {
  StreamGuard g(quick(), 6);
  Sim sim{g, 2400, 2000};
  sim.run(20000);
  ASSERT_EQ(g.last_report().verdict, StreamVerdict::kSettle);
  const uint32_t trials = g.trials();
  sim.recorded_ns = 1500;  // the workload changes: fusion now pays
  sim.run(40000);
  EXPECT_GT(g.trials(), trials);
  EXPECT_EQ(g.last_report().verdict, StreamVerdict::kRecord);
  EXPECT_FALSE(g.settled());
}

TEST(StreamGuard, AbortDropsTheTrial) {
  StreamGuard g(quick(), 7);
  Sim sim{g, 2400, 2000};
  sim.run(1200);  // past after_ops: a trial runs
  ASSERT_TRUE(g.on_trial());
  g.abort();
  EXPECT_FALSE(g.on_trial());
  EXPECT_EQ(g.on_recorded_op_at(sim.now + 10), 0u);
}

TEST(StreamGuard, PolicyCarriesTheSettings) {
  fusion::Policy p;
  p.settle_trial = false;
  p.settle_trial_max_op_us = 12;
  p.guard.min_pairs = 9;
  const StreamTrialSettings s = p.stream_trial();
  EXPECT_FALSE(s.enabled);
  EXPECT_DOUBLE_EQ(s.max_op_us, 12);
  EXPECT_EQ(s.min_pairs, 9u);
  p.settle_trial = true;
  EXPECT_TRUE(p.stream_trial().enabled);
  p.settle_cuts = 0;  // always record
  EXPECT_FALSE(p.stream_trial().enabled);
  p.settle_cuts = 8;
  p.guard.enabled = false;  // every hot key fused: no guard of either kind
  EXPECT_FALSE(p.stream_trial().enabled);
}
