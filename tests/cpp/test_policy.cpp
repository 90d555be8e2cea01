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
