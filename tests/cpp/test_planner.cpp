#include <gtest/gtest.h>

#include "fusion/planner.h"

using namespace neuron::fusion;

namespace {
PlanOp pw(int64_t numel, std::vector<int64_t> in, std::vector<int64_t> out, bool alive = true) {
  PlanOp op;
  op.pointwise = true;
  op.numel = numel;
  op.inputs = std::move(in);
  op.outputs = std::move(out);
  op.alive = std::vector<bool>(op.outputs.size(), alive);
  return op;
}
}  // namespace

TEST(Planner, GroupsPointwiseRunsAndKeepsExternOpsApart) {
  PlanOp mm;
  mm.inputs = {0, 1};
  mm.outputs = {2};
  mm.alive = {true};
  // mm -> add -> gelu -> mul (-> result)
  std::vector<PlanOp> ops = {mm, pw(64, {2, 3}, {4}, false), pw(64, {4}, {5}, false),
                             pw(64, {5, -1}, {6}, true)};
  Program p = plan(ops, 2);
  ASSERT_EQ(p.steps.size(), 2u);
  EXPECT_EQ(p.steps[0].kind, Step::kExtern);
  EXPECT_EQ(p.steps[1].kind, Step::kTileGroup);
  EXPECT_EQ(p.steps[1].count, 3u);
  EXPECT_EQ(p.fused_ops, 3u);
  // add's and gelu's outputs are dead and used only inside the group: scratch.
  EXPECT_TRUE(p.steps[1].scratch[0][0]);
  EXPECT_TRUE(p.steps[1].scratch[1][0]);
  EXPECT_FALSE(p.steps[1].scratch[2][0]);  // the result is alive
  EXPECT_EQ(p.scratch_values, 2u);
}

TEST(Planner, ValuesReadLaterOrAliveAreWritten) {
  PlanOp ext;
  ext.inputs = {10};  // an extern op after the group reads the first intermediate
  ext.outputs = {11};
  std::vector<PlanOp> ops = {pw(8, {1}, {10}, false), pw(8, {10}, {12}, false), ext};
  Program p = plan(ops, 2);
  ASSERT_EQ(p.steps.size(), 2u);
  EXPECT_FALSE(p.steps[0].scratch[0][0]);  // read after the group
  EXPECT_FALSE(p.steps[0].scratch[1][0]);  // dead but never read inside: still written
}

TEST(Planner, ShapeChangeOrShortRunsSplitGroups) {
  std::vector<PlanOp> ops = {pw(8, {1}, {2}), pw(16, {2}, {3}), pw(16, {3}, {4})};
  Program p = plan(ops, 2);
  ASSERT_EQ(p.steps.size(), 2u);
  EXPECT_EQ(p.steps[0].kind, Step::kExtern);
  EXPECT_EQ(p.steps[1].kind, Step::kTileGroup);
  EXPECT_EQ(plan(ops, 3).fused_ops, 0u);
}

TEST(Planner, GroupsOverTooFewElementsStayPerOp) {
  std::vector<PlanOp> ops = {pw(4096, {1}, {2}, false), pw(4096, {2}, {3}), pw(1 << 16, {3}, {4}, false),
                             pw(1 << 16, {4}, {5})};
  Program p = plan(ops, 2, 1 << 16);
  ASSERT_EQ(p.steps.size(), 3u);  // the 4096-element run per op, the 65536-element one a group
  EXPECT_EQ(p.steps[0].kind, Step::kExtern);
  EXPECT_EQ(p.steps[1].kind, Step::kExtern);
  EXPECT_EQ(p.steps[2].kind, Step::kTileGroup);
  EXPECT_EQ(p.fused_ops, 2u);
  EXPECT_EQ(plan(ops, 2, 0).fused_ops, 4u);  // no floor: both runs group
  // Foreach groups have no floor: they save a work item per tensor whatever the size.
  PlanOp each;
  each.list = 2;
  each.inputs = {1, 2};
  PlanOp each2 = each;
  each2.inputs = {3, 4};
  EXPECT_EQ(plan({each, each2}, 2, uint64_t{1} << 40).fused_ops, 2u);
}

TEST(Planner, GroupsHoldAtMostMaxGroupBytesOfFreshOutputs) {
  // Twelve 16 MiB pointwise ops in a row: one group without a bound, groups of at most
  // 64 MiB of fresh outputs (four ops) with one. A lone op over the bound still pairs.
  std::vector<PlanOp> ops;
  for (int64_t k = 0; k < 12; ++k) {
    ops.push_back(pw(1 << 22, {k}, {k + 1}, k == 11));
    ops.back().out_bytes = int64_t{16} << 20;
  }
  Program whole = plan(ops, 2, 0, 0);
  ASSERT_EQ(whole.steps.size(), 1u);
  EXPECT_EQ(whole.steps[0].count, 12u);
  Program bounded = plan(ops, 2, 0, uint64_t{64} << 20);
  ASSERT_EQ(bounded.steps.size(), 3u);
  for (const auto& step : bounded.steps) {
    EXPECT_EQ(step.kind, Step::kTileGroup);
    EXPECT_EQ(step.count, 4u);
  }
  EXPECT_EQ(bounded.fused_ops, 12u);
  // Values crossing a group boundary are written; inside a group they stay scratch.
  EXPECT_FALSE(bounded.steps[0].scratch[3][0]);
  EXPECT_TRUE(bounded.steps[0].scratch[2][0]);
  Program tiny = plan(ops, 2, 0, 1);
  ASSERT_EQ(tiny.steps.size(), 6u);
  EXPECT_EQ(tiny.steps[0].count, 2u);
}

TEST(Planner, IndependentChainsSplitOnceAGroupHoldsASixteenthOfTheBound) {
  // Four iterations of a three-op chain, each starting from the same input (value 100):
  // with 16 MiB outputs a group ends at each iteration (48 MiB >= 512 MiB / 16); with
  // 1 MiB outputs the iterations stay one group (kernel calls still matter there).
  auto chains = [](int64_t bytes) {
    std::vector<PlanOp> ops;
    for (int64_t it = 0; it < 4; ++it) {
      const int64_t v = 10 * it;
      ops.push_back(pw(1 << 22, {100}, {v + 1}, false));
      ops.push_back(pw(1 << 22, {v + 1, 100}, {v + 2}, false));
      ops.push_back(pw(1 << 22, {v + 2}, {v + 3}, it == 3));
      for (int k = 0; k < 3; ++k) ops[ops.size() - 1 - k].out_bytes = bytes;
    }
    return ops;
  };
  Program large = plan(chains(int64_t{16} << 20), 2, 0, uint64_t{512} << 20);
  ASSERT_EQ(large.steps.size(), 4u);
  for (const auto& step : large.steps) EXPECT_EQ(step.count, 3u);
  Program small = plan(chains(int64_t{1} << 20), 2, 0, uint64_t{512} << 20);
  ASSERT_EQ(small.steps.size(), 1u);
  EXPECT_EQ(small.steps[0].count, 12u);
  // A dependent chain of the same size is not split below the bound.
  std::vector<PlanOp> chain;
  for (int64_t k = 0; k < 12; ++k) {
    chain.push_back(pw(1 << 22, {k}, {k + 1}, k == 11));
    chain.back().out_bytes = int64_t{16} << 20;
  }
  EXPECT_EQ(plan(chain, 2, 0, uint64_t{512} << 20).steps.size(), 1u);
}

TEST(Planner, TileSizeFitsTheBudget) {
  EXPECT_EQ(tile_elements(4, 4) % 64, 0);
  EXPECT_LE(tile_elements(4, 4) * 4 * 4, 2 * 1024 * 1024);
  EXPECT_GE(tile_elements(1000, 8), 64);
  EXPECT_EQ(tile_elements(4, 4, 8 << 20), 4 * tile_elements(4, 4));  // the policy's budget
  EXPECT_LE(tile_elements(3, 4, 1 << 16) * 3 * 4, 1 << 16);
}

TEST(Planner, PerRowOpsJoinOnlyGroupsWithKnownRows) {
  // pow (full) -> mean (row 32: 8 per-row values) -> add, rsqrt (per row) -> mul (rows)
  PlanOp mean = pw(256, {2}, {3}, false);
  mean.row = 32;
  PlanOp add = pw(8, {3, -1}, {4}, false), rsqrt = pw(8, {4}, {5}, false);
  add.per_row = rsqrt.per_row = true;
  PlanOp mul = pw(256, {1, 5}, {6});
  mul.row = 32;
  Program p = plan({pw(256, {1}, {2}, false), mean, add, rsqrt, mul}, 2);
  ASSERT_EQ(p.steps.size(), 1u);
  EXPECT_EQ(p.steps[0].count, 5u);
  EXPECT_EQ(p.steps[0].row, 32);
  EXPECT_TRUE(p.steps[0].scratch[2][0]);  // per-row intermediates stay in scratch too
  // Before the rows are known, per-row ops do not join a full-size run.
  Program q = plan({pw(256, {1}, {2}, false), add, rsqrt}, 2);
  ASSERT_EQ(q.steps.size(), 2u);
  EXPECT_EQ(q.steps[0].kind, Step::kExtern);
  EXPECT_EQ(q.steps[1].count, 2u);  // add and rsqrt: a plain group of 8 elements
  // A per-row op whose count does not divide into the group's rows ends the group.
  PlanOp other = add;
  other.numel = 7;
  EXPECT_EQ(plan({pw(256, {1}, {2}, false), mean, other}, 2).steps.size(), 2u);
}

namespace {
PlanOp each(int64_t n, std::vector<int64_t> in, std::vector<int64_t> out = {}) {
  PlanOp op;
  op.list = n;
  op.inputs = std::move(in);
  op.outputs = std::move(out);
  op.alive.assign(op.outputs.size(), true);
  return op;
}
}  // namespace

TEST(Planner, ForeachOpsOverDisjointElementsRunTensorByTensor) {
  // mul_(p), lerp_(m, g), sqrt(v) -> s, addcdiv_(p, m, s): element i touches only p_i,
  // m_i, g_i, v_i, s_i.
  std::vector<PlanOp> ops = {each(2, {1, 2}), each(2, {3, 4, 5, 6}), each(2, {7, 8}, {9, 10}),
                             each(2, {1, 2, 3, 4, 9, 10})};
  Program p = plan(ops, 2);
  ASSERT_EQ(p.steps.size(), 1u);
  EXPECT_EQ(p.steps[0].kind, Step::kForeachGroup);
  EXPECT_EQ(p.steps[0].count, 4u);
  EXPECT_EQ(p.steps[0].list, 2);
  EXPECT_EQ(p.fused_ops, 4u);
  // A tensor at index 0 in one op and index 1 in the next: running tensor by tensor would
  // reorder a write and a read of it, so the group ends before that op.
  Program q = plan({each(2, {1, 2}), each(2, {3, 4}), each(2, {2, 1})}, 2);
  ASSERT_EQ(q.steps.size(), 2u);
  EXPECT_EQ(q.steps[0].count, 2u);
  EXPECT_EQ(q.steps[1].kind, Step::kExtern);
  // Lists of other lengths, or one op alone, stay per op.
  EXPECT_EQ(plan({each(2, {1, 2}), each(3, {3, 4, 5})}, 2).fused_ops, 0u);
}
