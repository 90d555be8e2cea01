#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "trace/segmenter.h"
#include "trace/trace_cache.h"

using namespace neuron::trace;

namespace {

// A synthetic training-loop body: op i reads the previous op's output (and a weight that
// lives across iterations) and writes a fresh storage.
struct Loop {
  uint64_t next_storage = 1000;
  uint64_t seq = 0;
  std::vector<uint64_t> signatures = {11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22};
  uint64_t weight = 7;

  std::vector<SegmentOp> iteration() {
    std::vector<SegmentOp> ops;
    uint64_t prev = 0;
    for (size_t i = 0; i < signatures.size(); ++i) {
      SegmentOp op;
      op.op = static_cast<OpId>(i + 1);
      op.signature = signatures[i];
      op.inputs = {prev == 0 ? weight : prev, weight};
      op.outputs = {next_storage++};
      op.seq = seq++;
      prev = op.outputs[0];
      ops.push_back(op);
    }
    return ops;
  }
};

std::set<uint64_t> steady_keys(size_t phase, SegmentPolicy policy) {
  Loop loop;
  Segmenter seg(policy);
  std::vector<Segment> closed;
  auto first = loop.iteration();
  for (size_t i = phase; i < first.size(); ++i) seg.push(first[i], closed);  // start mid-loop
  for (int it = 0; it < 6; ++it)
    for (auto& op : loop.iteration()) seg.push(op, closed);
  closed.clear();  // warm-up done: keep what steady iterations produce
  for (int it = 0; it < 4; ++it)
    for (auto& op : loop.iteration()) seg.push(op, closed);
  std::set<uint64_t> keys;
  for (auto& s : closed) keys.insert(s.key);
  return keys;
}

SegmentOp op_with(uint64_t sig, std::vector<uint64_t> in, std::vector<uint64_t> out) {
  SegmentOp op;
  op.signature = sig;
  op.inputs = std::move(in);
  op.outputs = std::move(out);
  return op;
}

}  // namespace

TEST(Segmenter, SameLoopBodySameKeysAtAnyPhase) {
  SegmentPolicy policy;
  policy.rolling_mask = 0x3;
  policy.cut_after = {5};  // a "matmul" in the middle of the body
  auto reference = steady_keys(0, policy);
  ASSERT_FALSE(reference.empty());
  for (size_t phase = 1; phase < 12; ++phase) EXPECT_EQ(steady_keys(phase, policy), reference) << phase;
}

TEST(Segmenter, ARunOfCutAfterOpsEndsOneSegment) {
  SegmentPolicy policy;
  policy.use_rolling_cut = false;
  policy.cut_after = {9};  // "matmul"
  Segmenter seg(policy);
  std::vector<Segment> closed;
  // add, mm, mm, mm, mul, mm, add: cut after the run of three and after the lone one.
  for (OpId id : {1, 9, 9, 9, 2, 9, 1}) {
    SegmentOp op = op_with(id, {}, {});
    op.op = id;
    seg.push(op, closed);
  }
  ASSERT_EQ(closed.size(), 2u);
  EXPECT_EQ(closed[0].length, 4u);
  EXPECT_EQ(closed[0].reason, CutReason::kContent);
  EXPECT_EQ(closed[1].length, 2u);
  EXPECT_EQ(seg.open_length(), 1u);
  // A flush clears the pending cut: the next segment starts fresh.
  seg.flush(CutReason::kSync);
  seg.push(op_with(9, {}, {}), closed);
  EXPECT_EQ(closed.size(), 2u);
}

TEST(Segmenter, AContentCutNeverSplitsARunOfWholeRunOps) {
  // Mask 0: the rolling hash cuts after every op. A run of foreach ops (an optimizer
  // step) stays one segment: the cut that fell inside it comes before the next other op.
  for (bool keep : {true, false}) {
    SegmentPolicy policy;
    policy.rolling_window = 1;
    policy.rolling_mask = 0;
    policy.keep_runs_whole = keep;
    Segmenter seg(policy);
    std::vector<Segment> closed;
    uint64_t sig = 100;
    for (bool run : {false, false, true, true, true, false, true}) {
      SegmentOp op = op_with(sig++, {}, {});
      op.whole_run = run;
      seg.push(op, closed);
    }
    std::vector<uint32_t> lengths;
    for (const auto& c : closed) lengths.push_back(c.length);
    if (keep) {
      EXPECT_EQ(lengths, (std::vector<uint32_t>{1, 1, 3, 1})) << "kept whole";
      EXPECT_EQ(closed[2].reason, CutReason::kContent);
      EXPECT_EQ(seg.open_length(), 1u);  // the last run is still open
      ASSERT_TRUE(seg.flush(CutReason::kSync).has_value());
      seg.push(op_with(sig++, {}, {}), closed);  // the flush cleared the deferred cut
      EXPECT_EQ(closed.size(), 5u);
    } else {
      EXPECT_EQ(lengths, (std::vector<uint32_t>{1, 1, 1, 1, 1, 1, 1})) << "split";
    }
  }
}

TEST(Segmenter, MaxLengthCuts) {
  SegmentPolicy policy;
  policy.use_rolling_cut = false;
  policy.max_length = 5;
  Segmenter seg(policy);
  Loop loop;
  std::vector<Segment> closed;
  for (auto& op : loop.iteration()) seg.push(op, closed);
  ASSERT_EQ(closed.size(), 2u);
  EXPECT_EQ(closed[0].length, 5u);
  EXPECT_EQ(closed[0].reason, CutReason::kMaxLength);
  EXPECT_EQ(seg.open_length(), 2u);
}

TEST(Segmenter, BarrierClosesTheOpenSegment) {
  Segmenter seg;
  std::vector<Segment> closed;
  seg.push(op_with(1, {5}, {6}), closed);
  SegmentOp barrier = op_with(2, {6}, {7});
  barrier.barrier = true;
  seg.push(barrier, closed);
  ASSERT_EQ(closed.size(), 1u);
  EXPECT_EQ(closed[0].reason, CutReason::kBarrier);
  EXPECT_EQ(seg.open_length(), 0u);
}

TEST(SegmentKey, ChangesWithSignatureDataflowAliasingAndLiveness) {
  auto key = [](std::vector<SegmentOp> ops, std::vector<bool> alive = {}) {
    return make_segment(ops, CutReason::kFlush, alive).key;
  };
  // a = f(x, y); b = g(a, x)
  const auto base = key({op_with(1, {100, 200}, {300}), op_with(2, {300, 100}, {400})});
  // Same structure, other storages: same key.
  EXPECT_EQ(base, key({op_with(1, {101, 201}, {301}), op_with(2, {301, 101}, {401})}));
  // Signature (shape, dtype, stride, scalar) change: another key.
  EXPECT_NE(base, key({op_with(9, {100, 200}, {300}), op_with(2, {300, 100}, {400})}));
  // Dataflow: g reads y instead of x.
  EXPECT_NE(base, key({op_with(1, {100, 200}, {300}), op_with(2, {300, 200}, {400})}));
  // Dataflow: g reads an external value instead of f's output.
  EXPECT_NE(base, key({op_with(1, {100, 200}, {300}), op_with(2, {500, 100}, {400})}));
  // Aliasing: x and y are the same storage.
  EXPECT_NE(base, key({op_with(1, {100, 100}, {300}), op_with(2, {300, 100}, {400})}));
  // Liveness: f's output is dead after the segment.
  EXPECT_NE(base, key({op_with(1, {100, 200}, {300}), op_with(2, {300, 100}, {400})}, {false, true}));
}

TEST(TraceCache, CountsHitsTurnsHotAndCatchesForcedCollisions) {
  TraceCache cache(/*hot_threshold=*/3);
  Segment a = make_segment({op_with(1, {1}, {2})}, CutReason::kFlush, {});
  EXPECT_EQ(cache.observe(a, 0), TraceCache::Lookup::kMiss);
  EXPECT_EQ(cache.observe(a, 1), TraceCache::Lookup::kHit);
  uint64_t count = 0;
  EXPECT_EQ(cache.observe(a, 2, &count), TraceCache::Lookup::kHit);
  EXPECT_EQ(count, 3u);
  SegmentEntry e;
  ASSERT_TRUE(cache.find(a.key, e));
  EXPECT_EQ(e.state, SegmentState::kHot);
  // A different segment forced onto the same key is caught by verification.
  Segment b = make_segment({op_with(2, {1}, {2})}, CutReason::kFlush, {});
  b.key = a.key;
  EXPECT_EQ(cache.observe(b, 3), TraceCache::Lookup::kCollision);
  EXPECT_EQ(cache.stats().collisions, 1u);
  auto s = cache.stats();
  EXPECT_EQ(s.transitions[0][1], 1u);  // cold -> hot once
}

TEST(Segmenter, LongLoopsWithoutContentCutsAreCutOncePerPeriodInPhase) {
  // A 5-op body the rolling hash never cuts (a mask no hash meets in practice): after the
  // first max-length cut, segments end where the body repeats, all with one key.
  SegmentPolicy policy;
  policy.max_length = 16;
  policy.loop_min_ops = 8;  // what the policy's loop_cut_min_ops = 0 gives: max_length / 2
  policy.rolling_mask = ~uint64_t{0};
  Loop loop;
  loop.signatures = {31, 32, 33, 34, 35};
  Segmenter seg(policy);
  std::vector<Segment> closed;
  for (int it = 0; it < 12; ++it)
    for (auto& op : loop.iteration()) seg.push(op, closed);
  ASSERT_GE(closed.size(), 4u);
  EXPECT_EQ(closed[0].length, 16u);
  EXPECT_EQ(closed[0].reason, CutReason::kMaxLength);
  for (size_t i = 1; i < closed.size(); ++i) {
    EXPECT_EQ(closed[i].length, 10u) << i;  // two bodies: the first repeat at >= 8 ops
    EXPECT_EQ(closed[i].reason, CutReason::kContent) << i;
    EXPECT_EQ(closed[i].key, closed[1].key) << i;
  }
  // Without rolling cuts there are no period cuts either.
  policy.use_rolling_cut = false;
  Segmenter plain(policy);
  std::vector<Segment> fixed;
  for (int it = 0; it < 12; ++it)
    for (auto& op : loop.iteration()) plain.push(op, fixed);
  for (const auto& s : fixed) EXPECT_EQ(s.reason, CutReason::kMaxLength);
}

namespace {

// The canonical form written out plainly with std::map, as the oracle for the keyed,
// table-reusing make_segment_into.
std::vector<int64_t> reference_words(const std::vector<SegmentOp>& ops, const std::vector<bool>& alive) {
  std::map<uint64_t, std::pair<int64_t, int64_t>> produced;
  std::map<uint64_t, int64_t> external;
  std::vector<int64_t> w;
  for (size_t i = 0; i < ops.size(); ++i) {
    w.push_back(static_cast<int64_t>(ops[i].signature));
    w.push_back(static_cast<int64_t>(ops[i].inputs.size()));
    for (uint64_t s : ops[i].inputs) {
      if (s == 0) {
        w.push_back(3);
      } else if (produced.count(s)) {
        w.insert(w.end(), {1, produced[s].first, produced[s].second});
      } else {
        if (!external.count(s)) {
          const auto next = static_cast<int64_t>(external.size());
          external[s] = next;
        }
        w.insert(w.end(), {2, external[s]});
      }
    }
    for (size_t k = 0; k < ops[i].outputs.size(); ++k)
      if (ops[i].outputs[k] != 0) produced[ops[i].outputs[k]] = {static_cast<int64_t>(i), static_cast<int64_t>(k)};
  }
  size_t out = 0;
  for (const auto& op : ops)
    for (size_t k = 0; k < op.outputs.size(); ++k, ++out) w.push_back(out < alive.size() && !alive[out] ? 5 : 4);
  return w;
}

// Random ops over a pool of storages: aliasing, values produced inside, missing inputs,
// undefined outputs, an output storage written twice, lists past the inline capacity.
std::vector<SegmentOp> random_ops(std::mt19937_64& rng, size_t n, uint64_t pool) {
  std::vector<SegmentOp> ops(n);
  for (size_t i = 0; i < n; ++i) {
    ops[i].signature = rng() % 5;
    const size_t ins = rng() % 9, outs = rng() % 8;
    for (size_t k = 0; k < ins; ++k) ops[i].inputs.push_back(rng() % 6 == 0 ? 0 : 1 + rng() % pool);
    for (size_t k = 0; k < outs; ++k) ops[i].outputs.push_back(rng() % 7 == 0 ? 0 : 1 + rng() % pool);
    ops[i].seq = i;
  }
  return ops;
}

}  // namespace

TEST(SegmentKey, ReusedTablesAndWordsMatchThePlainCanonicalForm) {
  std::mt19937_64 rng(7);
  Segment reused;  // one segment object for every call, as the engine's cut does
  for (int round = 0; round < 300; ++round) {
    // Sizes swing between short and long, so tables grow and are then reused smaller.
    const size_t n = round % 3 == 0 ? 1 + rng() % 300 : 1 + rng() % 12;
    auto ops = random_ops(rng, n, round % 2 ? 8 : 4000);
    std::vector<bool> alive;
    size_t outputs = 0;
    for (const auto& op : ops) outputs += op.outputs.size();
    for (size_t k = 0; k < outputs; ++k) alive.push_back(rng() % 3 != 0);
    make_segment_into(ops, CutReason::kContent, alive, reused);
    const auto want = reference_words(ops, alive);
    ASSERT_EQ(reused.words, want) << "round " << round;
    EXPECT_EQ(reused.length, n);
    EXPECT_EQ(reused.key, make_segment(ops, CutReason::kContent, alive).key);
  }
}

TEST(SmallVec, InlineThenHeapWithVectorSemantics) {
  SmallVec<uint64_t, 4> v;
  EXPECT_TRUE(v.empty());
  for (uint64_t i = 0; i < 4; ++i) v.push_back(i);
  EXPECT_EQ(v.capacity(), 4u);  // still inline
  v.push_back(v[0]);            // spills while reading its own element
  for (uint64_t i = 5; i < 40; ++i) v.push_back(i * 3);
  ASSERT_EQ(v.size(), 40u);
  EXPECT_EQ(v[4], 0u);
  EXPECT_EQ(v.back(), 39u * 3);
  SmallVec<uint64_t, 4> copy = v;
  EXPECT_EQ(copy, v);
  SmallVec<uint64_t, 4> moved = std::move(copy);
  EXPECT_EQ(moved, v);
  EXPECT_TRUE(copy.empty());  // NOLINT: a moved-from SmallVec is empty and usable
  copy.push_back(9);
  EXPECT_EQ(copy.size(), 1u);
  SmallVec<uint64_t, 4> small = {1, 2};
  SmallVec<uint64_t, 4> small_moved = std::move(small);
  EXPECT_EQ(small_moved, (SmallVec<uint64_t, 4>{1, 2}));
  small_moved = v;  // inline <- heap-sized copy
  EXPECT_EQ(small_moved, v);
  v.clear();
  EXPECT_TRUE(v.empty());
  v.assign(3, 8);
  EXPECT_EQ(v, (SmallVec<uint64_t, 4>{8, 8, 8}));
  v = std::vector<uint64_t>{4, 5};
  EXPECT_EQ(v, (SmallVec<uint64_t, 4>{4, 5}));
  v.resize(6, 1);
  EXPECT_EQ(v, (SmallVec<uint64_t, 4>{4, 5, 1, 1, 1, 1}));
}

// A loop body whose shapes change (its signatures differ per "batch size"): with kinds the
// rolling hash cuts it at the same places for every shape, so the keys differ but the
// families match; with rolling_shapes the cuts move with the signatures.
TEST(Segmenter, ShapeFreeCutsLineUpKeysOfOneFamily) {
  auto segments = [](uint64_t shape, bool rolling_shapes) {
    SegmentPolicy policy;
    policy.rolling_mask = 0x1;
    policy.rolling_shapes = rolling_shapes;
    Segmenter seg(policy);
    std::vector<Segment> closed;
    uint64_t storage = 100;
    for (int it = 0; it < 8; ++it) {
      uint64_t prev = 1;
      for (uint64_t i = 0; i < 12; ++i) {
        SegmentOp op = op_with(shape * 1000 + i, {prev}, {++storage});
        op.op = static_cast<OpId>(i + 1);
        op.kind = op_kind("aten::op" + std::to_string(i));
        prev = storage;
        seg.push(op, closed);
      }
    }
    return closed;
  };
  const auto a = segments(1, false), b = segments(2, false);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_GT(a.size(), 8u);  // cut inside the body too
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].length, b[i].length) << i;
    EXPECT_EQ(a[i].family, b[i].family) << i;
    EXPECT_NE(a[i].key, b[i].key) << i;
  }
  std::vector<uint32_t> la, lb;
  for (const auto& s : segments(1, true)) la.push_back(s.length);
  for (const auto& s : segments(2, true)) lb.push_back(s.length);
  EXPECT_NE(la, lb);  // by signature the two shapes are cut differently
  EXPECT_NE(op_kind("aten::add.Tensor"), op_kind("aten::mul.Tensor"));
  EXPECT_EQ(op_kind("aten::add.Tensor"), op_kind(std::string("aten::add.") + "Tensor"));
}
