#include <gtest/gtest.h>

#include "fusion/policy.h"

using namespace neuron::fusion;

TEST(Policy, BuiltinsExistAndDiffer) {
  for (const auto& name : builtin_policy_names()) ASSERT_TRUE(builtin_policy(name)) << name;
  EXPECT_FALSE(builtin_policy("bogus"));
  EXPECT_LT(builtin_policy("aggressive")->hot_threshold, builtin_policy("conservative")->hot_threshold);
  EXPECT_FALSE(builtin_policy("never")->should_compile(100, Tier::kInstant));
}

TEST(Policy, FileParsesEveryKnobKind) {
  std::string error;
  auto p = parse_policy(
      "# a comment\nbase = aggressive\nhot_threshold = 7\ncut_after_matmul = false\n"
      "tier = native\nexpected_repeats = 12.5\nfusible_ops = aten::add.Tensor, aten::mul.Tensor\n",
      "test", error);
  ASSERT_TRUE(p) << error;
  EXPECT_EQ(p->hot_threshold, 7u);
  EXPECT_FALSE(p->cut_after_matmul);
  EXPECT_EQ(p->tier, Tier::kNative);
  EXPECT_DOUBLE_EQ(p->expected_repeats, 12.5);
  EXPECT_EQ(p->fusible_ops.size(), 2u);
  EXPECT_EQ(p->max_segment_length, 1024u);  // from the aggressive base
  p = parse_policy("min_group_elements = 1099511627776\n", "test", error);
  ASSERT_TRUE(p) << error;
  EXPECT_EQ(p->min_group_elements, uint64_t{1} << 40);
  EXPECT_FALSE(parse_policy("min_group_elements = 1099511627777\n", "f", error));
  EXPECT_NE(error.find("0..1099511627776"), std::string::npos) << error;
  EXPECT_FALSE(parse_policy("min_group_elements = -1\n", "f", error));
  p = parse_policy("tile_bytes = 8388608\n", "test", error);
  ASSERT_TRUE(p) << error;
  EXPECT_EQ(p->tile_bytes, uint64_t{8} << 20);
  EXPECT_FALSE(parse_policy("tile_bytes = 1024\n", "f", error));
  EXPECT_NE(error.find("65536..1073741824"), std::string::npos) << error;
}

TEST(Policy, BadFilesNameTheKeyAndTheRange) {
  std::string error;
  EXPECT_FALSE(parse_policy("hot_treshold = 3\n", "f", error));
  EXPECT_NE(error.find("unknown policy key 'hot_treshold'"), std::string::npos) << error;
  EXPECT_NE(error.find("hot_threshold"), std::string::npos) << error;  // lists the allowed keys
  EXPECT_FALSE(parse_policy("x\nmax_segment_length = 0\n", "f", error));
  EXPECT_NE(error.find("line 1"), std::string::npos) << error;
  EXPECT_FALSE(parse_policy("max_segment_length = 0\n", "f", error));
  EXPECT_NE(error.find("1..4096"), std::string::npos) << error;
  EXPECT_FALSE(parse_policy("lift_scalars = maybe\n", "f", error));
  EXPECT_NE(error.find("true or false"), std::string::npos) << error;
  EXPECT_FALSE(parse_policy("base = fastest\n", "f", error));
  EXPECT_NE(error.find("fastest"), std::string::npos) << error;
}

TEST(Policy, CostGateWeighsSavingAgainstCompileCost) {
  Policy p;
  p.min_fusible_ops = 2;
  p.per_op_saving_us = 1;
  p.expected_repeats = 100;
  p.compile_cost_us_instant = 150;
  EXPECT_FALSE(p.should_compile(1, Tier::kInstant));  // below min_fusible_ops
  EXPECT_TRUE(p.should_compile(2, Tier::kInstant));   // 200 > 150
  p.compile_cost_us_instant = 250;
  EXPECT_FALSE(p.should_compile(2, Tier::kInstant));
}

TEST(Policy, JsonHasEveryKnob) {
  auto json = policy_json(Policy{});
  for (const char* key : {"hot_threshold", "max_segment_length", "tier", "fusible_ops", "lift_scalars",
                          "min_group_elements", "tile_bytes"})
    EXPECT_NE(json.find(key), std::string::npos) << key;
}

TEST(Policy, Tier2AndThreadKnobsKeepTheirFormerDefaults) {
  const Policy p;
  EXPECT_EQ(p.native_trials, 3u);
  EXPECT_EQ(p.native_max_build_failures, 3u);
  EXPECT_EQ(p.tier1_choice_runs, 3u);
  EXPECT_EQ(p.native_min_tile_elements, 16384u);
  EXPECT_EQ(p.native_tiles, 64u);
  EXPECT_EQ(p.foreach_piece_elements, uint64_t{1} << 16);
  EXPECT_EQ(p.spread_elements, uint64_t{1} << 18);
  EXPECT_EQ(p.large_matmul_work, uint64_t{1} << 19);
  // Build retries after 5 s, then 20 s; the third failure gives up.
  EXPECT_EQ(p.native_retry_delay_ns(1), 5'000'000'000ull);
  EXPECT_EQ(p.native_retry_delay_ns(2), 20'000'000'000ull);
  EXPECT_FALSE(p.native_gives_up(2));
  EXPECT_TRUE(p.native_gives_up(3));
  // Tiles: about 64 per group, a multiple of 64 elements, at least 16384.
  EXPECT_EQ(p.native_tile(1000), 16384);
  EXPECT_EQ(p.native_tile(int64_t{1} << 24), int64_t{1} << 18);
  EXPECT_EQ(p.native_tile(64 * 100000) % 64, 0);
  const std::string listed = describe_policy_knobs();
  for (const char* line : {"native_trials (default 3; integer 1..1000)", "native_max_build_failures (default 3;",
                           "native_retry_after_us (default 5e+06;", "native_retry_growth (default 4;",
                           "tier1_choice_runs (default 3;", "native_min_tile_elements (default 16384;",
                           "native_tiles (default 64;", "foreach_piece_elements (default 65536;",
                           "spread_elements (default 262144;", "large_matmul_work (default 524288;"})
    EXPECT_NE(listed.find(line), std::string::npos) << line;
}

TEST(Policy, Tier2AndThreadKnobsCheckTheirRanges) {
  std::string error;
  auto p = parse_policy(
      "native_trials = 5\nnative_max_build_failures = 1\nnative_retry_after_us = 0\n"
      "native_retry_growth = 1\ntier1_choice_runs = 1\nnative_min_tile_elements = 128\n"
      "native_tiles = 8\nforeach_piece_elements = 4096\nspread_elements = 0\n"
      "large_matmul_work = 1099511627776\n",
      "test", error);
  ASSERT_TRUE(p) << error;
  EXPECT_EQ(p->native_trials, 5u);
  EXPECT_TRUE(p->native_gives_up(1));
  EXPECT_EQ(p->native_retry_delay_ns(1), 0u);
  EXPECT_EQ(p->native_tile(8 * 1000), 1024);  // 1000 elements rounded up to 64s
  EXPECT_EQ(p->native_tile(100), 128);
  EXPECT_EQ(p->foreach_piece_elements, 4096u);
  EXPECT_EQ(p->spread_elements, 0u);
  EXPECT_EQ(p->large_matmul_work, uint64_t{1} << 40);
  const std::pair<const char*, const char*> bad[] = {
      {"native_trials = 0\n", "1..1000"},
      {"native_max_build_failures = 101\n", "1..100"},
      {"native_retry_after_us = -1\n", "0..1e10"},
      {"native_retry_growth = 0.5\n", "1..100"},
      {"tier1_choice_runs = 1001\n", "1..1000"},
      {"native_min_tile_elements = 100\n", "a multiple of 64"},
      {"native_min_tile_elements = 0\n", "64..1073741824"},
      {"native_tiles = 0\n", "1..65536"},
      {"foreach_piece_elements = 65537\n", "a multiple of 64"},
      {"spread_elements = 1099511627777\n", "0..1099511627776"},
      {"large_matmul_work = lots\n", "0..1099511627776"},
  };
  for (const auto& [text, range] : bad) {
    EXPECT_FALSE(parse_policy(text, "f", error)) << text;
    EXPECT_NE(error.find(range), std::string::npos) << text << error;
  }
  // A long backoff saturates instead of wrapping around.
  ASSERT_TRUE(p = parse_policy("native_retry_after_us = 1e10\nnative_retry_growth = 100\n"
                               "native_max_build_failures = 100\n", "test", error)) << error;
  EXPECT_EQ(p->native_retry_delay_ns(99), UINT64_MAX);
}

TEST(Policy, NativeBuildGateDecidesAsTheTier2CostGate) {
  Policy p;  // auto: 5 runs measured, 0.3 x 10000 repeats against 2 s
  EXPECT_FALSE(p.should_build_native(5'000'000'000ull, 4));  // too few runs, however slow
  EXPECT_FALSE(p.should_build_native(0, 0));
  // Mean 100 us: 100 x 0.3 x 10000 = 300000 us < 2 s; mean 1 ms: 3 s > 2 s.
  EXPECT_FALSE(p.should_build_native(5 * 100'000ull, 5));
  EXPECT_TRUE(p.should_build_native(5 * 1'000'000ull, 5));
  EXPECT_TRUE(p.should_build_native(6 * 1'000'000ull, 6));
  p.tier = Tier::kNative;
  EXPECT_TRUE(p.should_build_native(0, 0));  // always
  p.tier = Tier::kInstant;
  EXPECT_FALSE(p.should_build_native(uint64_t{1} << 60, 1000));  // never
  EXPECT_FALSE(builtin_policy("never")->should_build_native(5 * 1'000'000'000ull, 5));
}

TEST(Policy, QueueAndThreadTrialKnobsKeepTheirFormerDefaultsAndCheckRanges) {
  const Policy d;
  EXPECT_EQ(d.queue_max_ops, 1024u);
  EXPECT_EQ(d.deep_backlog_ops, 256u);
  EXPECT_EQ(d.long_wait_us, 5000u);
  EXPECT_EQ(d.thread_trial_sightings, 3u);
  EXPECT_EQ(d.thread_trial_runs, 2u);
  EXPECT_EQ(d.thread_trial_min_output, 256u);
  const std::string listed = describe_policy_knobs();
  for (const char* line : {"queue_max_ops (default 1024; integer 2..1000000)", "deep_backlog_ops (default 256;",
                           "long_wait_us (default 5000;", "thread_trial_sightings (default 3; integer 1..99)",
                           "thread_trial_runs (default 2;", "thread_trial_min_output (default 256;"})
    EXPECT_NE(listed.find(line), std::string::npos) << line;
  std::string error;
  auto p = parse_policy(
      "queue_max_ops = 2\ndeep_backlog_ops = 1\nlong_wait_us = 0\nthread_trial_sightings = 99\n"
      "thread_trial_runs = 16\nthread_trial_min_output = 1\n",
      "test", error);
  ASSERT_TRUE(p) << error;
  EXPECT_EQ(p->queue_max_ops, 2u);
  EXPECT_EQ(p->deep_backlog_ops, 1u);
  EXPECT_EQ(p->long_wait_us, 0u);
  EXPECT_EQ(p->thread_trial_sightings, 99u);
  EXPECT_EQ(p->thread_trial_runs, 16u);
  EXPECT_EQ(p->thread_trial_min_output, 1u);
  const std::pair<const char*, const char*> bad[] = {
      {"queue_max_ops = 1\n", "2..1000000"},
      {"deep_backlog_ops = 0\n", "1..1000000"},
      {"long_wait_us = 10000001\n", "0..10000000"},
      {"thread_trial_sightings = 100\n", "1..99"},  // 100 is the trial's own "free" mark
      {"thread_trial_runs = 0\n", "1..16"},
      {"thread_trial_min_output = -5\n", "1..1073741824"},
  };
  for (const auto& [text, range] : bad) {
    EXPECT_FALSE(parse_policy(text, "f", error)) << text;
    EXPECT_NE(error.find(range), std::string::npos) << text << error;
  }
}

TEST(Policy, LoopCutMinOpsDefaultsToHalfTheMaximumLength) {
  Policy p;
  EXPECT_EQ(segment_policy_of(p, {}).loop_min_ops, 128u);
  p.max_segment_length = 64;
  EXPECT_EQ(segment_policy_of(p, {}).loop_min_ops, 32u);
  p.loop_cut_min_ops = 12;
  EXPECT_EQ(segment_policy_of(p, {}).loop_min_ops, 12u);
  std::string error;
  EXPECT_FALSE(parse_policy("loop_cut_min_ops = 5000\n", "f", error));
  EXPECT_NE(error.find("0..4096"), std::string::npos) << error;
}

TEST(Policy, PrefixHoldStopsOnlyWhenMissedOpsOutnumberHitOps) {
  Policy p;  // defaults: 256 missed ops before the ratio 4 applies
  EXPECT_TRUE(p.holds_prefix(0, 255));       // too few missed ops to judge
  EXPECT_FALSE(p.holds_prefix(0, 256));      // a prefix that never became its key
  EXPECT_TRUE(p.holds_prefix(64, 256));      // 4 missed ops per op of the key: still held
  EXPECT_FALSE(p.holds_prefix(64, 257));
  EXPECT_TRUE(p.holds_prefix(100000, 300000));
  EXPECT_EQ(Policy::prefix_decay_at(256), 16384u);
  EXPECT_EQ(Policy::prefix_decay_at(0), 64u);
  std::string error;
  auto q = parse_policy("hold_min_missed_ops = 0\nhold_miss_ratio = 0\n", "test", error);
  ASSERT_TRUE(q) << error;
  EXPECT_TRUE(q->holds_prefix(0, 0));   // nothing missed: holds
  EXPECT_FALSE(q->holds_prefix(9, 1));  // ratio 0: the first miss stops it
  EXPECT_FALSE(parse_policy("hold_miss_ratio = -1\n", "f", error));
  EXPECT_NE(error.find("0..1000000"), std::string::npos) << error;
}

TEST(Policy, SettledStretchesDoubleUpToTheirBound) {
  Policy p;
  EXPECT_EQ(Policy::settle_stretch(p.settle_first_ops, p.settle_max_ops, 0), 64u);
  EXPECT_EQ(Policy::settle_stretch(p.settle_first_ops, p.settle_max_ops, 1), 128u);
  EXPECT_EQ(Policy::settle_stretch(p.settle_first_ops, p.settle_max_ops, 6), 4096u);
  EXPECT_EQ(Policy::settle_stretch(p.settle_first_ops, p.settle_max_ops, 7), 4096u);
  EXPECT_EQ(Policy::settle_stretch(64, 4096, 1000), 4096u);  // no overflow
  EXPECT_EQ(Policy::settle_stretch(100, 10, 3), 100u);       // a bound below the start: the start
  std::string error;
  auto q = parse_policy("settle_cuts = 0\nsettle_first_ops = 1\nsettle_max_ops = 1000000000\n",
                        "test", error);
  ASSERT_TRUE(q) << error;
  EXPECT_EQ(q->settle_cuts, 0u);
  EXPECT_FALSE(parse_policy("settle_first_ops = 0\n", "f", error));
  EXPECT_NE(error.find("1..1000000000"), std::string::npos) << error;
}
