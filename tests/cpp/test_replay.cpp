#include <gtest/gtest.h>

#include <map>
#include <random>

#include "fusion/replay.h"
#include "trace/dataflow.h"
#include "trace/segmenter.h"

using namespace neuron;
using trace::Event;
using trace::EventKind;

namespace {

// A synthetic recording: a loop body of `body` elementwise ops chained through fresh
// storages and a weight that lives across iterations, with a sync every iteration.
struct Recording {
  std::vector<Event> events;
  std::vector<trace::SegmentOp> ops;  // what the engine's segmenter saw
  std::vector<size_t> sync_after;     // op indices followed by a sync
};

Recording record_loop(int iterations, int body, uint64_t seed = 1) {
  Recording rec;
  trace::DataflowLinker linker;
  std::mt19937_64 rng(seed);
  uint64_t seq = 100, storage = 1 << 20, time = 0;
  const uint64_t weight = 7;
  std::vector<uint32_t> codes;
  for (int it = 0; it < iterations; ++it) {
    uint64_t prev = weight;
    for (int k = 0; k < body; ++k) {
      trace::SegmentOp op;
      op.op = static_cast<uint32_t>(1 + k % 5);
      op.signature = 1000 + static_cast<uint64_t>(k);
      op.seq = ++seq;
      op.inputs = {prev, weight, k % 3 == 0 ? uint64_t{0} : prev};
      // Storages are recycled like a caching allocator would.
      op.outputs = {storage + (rng() % 6)};
      prev = op.outputs[0];
      Event d;
      d.time_ns = ++time;
      d.kind = static_cast<uint8_t>(EventKind::kOpDispatch);
      d.seq = op.seq;
      d.op = op.op;
      d.value = op.signature;
      d.aux = 4096 * 3;
      rec.events.push_back(d);
      Event x = d;
      x.kind = static_cast<uint8_t>(EventKind::kOpExecute);
      x.duration_ns = 1000 + 10 * static_cast<uint64_t>(k);
      rec.events.push_back(x);
      linker.link(op.seq, op.inputs, op.outputs, codes);
      trace::append_dataflow_events(d, codes, rec.events);
      rec.ops.push_back(op);
    }
    Event f;
    f.time_ns = ++time;
    f.kind = static_cast<uint8_t>(EventKind::kStreamFlush);
    f.seq = seq;
    f.flags = static_cast<uint16_t>(trace::CutReason::kSync);
    rec.events.push_back(f);
    rec.sync_after.push_back(rec.ops.size() - 1);
  }
  return rec;
}

fusion::ReplayOptions options(const std::string& policy) {
  fusion::ReplayOptions o;
  o.policy = *fusion::builtin_policy(policy);
  return o;
}

}  // namespace

TEST(Dataflow, LinksRecoverStorageIdentity) {
  trace::DataflowLinker linker;
  std::vector<uint32_t> codes;
  linker.link(10, {5, 0, 5}, {9}, codes);
  ASSERT_EQ(codes.size(), 4u);
  EXPECT_EQ(codes[0], trace::kLinkNew);
  EXPECT_EQ(codes[1], trace::kLinkNoTensor);
  ASSERT_TRUE(trace::is_link(codes[2]));
  EXPECT_EQ(trace::decode_link(codes[2]).distance, 0u);  // same op, slot 0
  EXPECT_EQ(trace::decode_link(codes[2]).slot, 0u);
  EXPECT_EQ(codes[3], trace::kLinkOutput);
  linker.link(12, {9}, {}, codes);
  ASSERT_TRUE(trace::is_link(codes[0]));
  EXPECT_EQ(trace::decode_link(codes[0]).distance, 2u);
  EXPECT_EQ(trace::decode_link(codes[0]).slot, 3u);  // the output slot of seq 10
}

TEST(Replay, ReproducesTheSegmentersCutsAndKeys) {
  Recording rec = record_loop(20, 37);
  // The engine's view: one segmenter fed every op, flushed at each sync.
  trace::Segmenter seg;
  std::vector<std::pair<uint64_t, uint64_t>> expected;  // (first seq, key)
  size_t sync = 0;
  for (size_t i = 0; i < rec.ops.size(); ++i) {
    if (auto reason = seg.add(rec.ops[i]))
      if (auto s = seg.flush(*reason)) expected.emplace_back(s->first_seq, s->key);
    if (sync < rec.sync_after.size() && rec.sync_after[sync] == i) {
      ++sync;
      if (auto s = seg.flush(trace::CutReason::kSync)) expected.emplace_back(s->first_seq, s->key);
    }
  }
  auto t = fusion::prepare_replay(rec.events.data(), rec.events.size());
  EXPECT_TRUE(t.has_dataflow);
  auto o = options("default");
  o.cut_after_ops = {};  // the reference segmenter above has no cut_after ops either
  auto r = fusion::replay(t, o);
  ASSERT_EQ(r.occ_key.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(r.occ_first_seq[i], expected[i].first) << i;
    EXPECT_EQ(r.occ_key[i], expected[i].second) << i;
  }
}

TEST(Replay, HotKeysCompileAtTheThresholdAndFuseAfter) {
  Recording rec = record_loop(10, 8);
  auto t = fusion::prepare_replay(rec.events.data(), rec.events.size());
  auto r = fusion::replay(t, options("default"));
  ASSERT_FALSE(r.keys.empty());
  for (const auto& k : r.keys) {
    if (k.occurrences < 3 || k.length < 2) continue;
    EXPECT_EQ(k.compiled_at, 3) << k.key;
    EXPECT_EQ(k.fused, k.occurrences - 3) << k.key;
  }
  EXPECT_GT(r.compiles, 0u);
  auto never = fusion::replay(t, options("never"));
  EXPECT_EQ(never.compiles, 0u);
  EXPECT_EQ(never.ops_fused, 0u);
  EXPECT_EQ(never.ops, rec.ops.size());
  // Measured per-op time of 'never' is the sum of the recorded executions.
  double total = 0;
  for (const auto& e : rec.events)
    if (e.kind == static_cast<uint8_t>(EventKind::kOpExecute)) total += static_cast<double>(e.duration_ns);
  EXPECT_NEAR(never.device_ns, total, 1e-6 * total);
}

TEST(Replay, IsDeterministic) {
  Recording rec = record_loop(15, 23, 5);
  auto t = fusion::prepare_replay(rec.events.data(), rec.events.size());
  for (const char* name : {"default", "aggressive", "conservative"}) {
    auto a = fusion::replay(t, options(name));
    auto b = fusion::replay(t, options(name));
    EXPECT_EQ(a.occ_key, b.occ_key);
    EXPECT_EQ(a.occ_fused, b.occ_fused);
    EXPECT_EQ(a.compiled_keys, b.compiled_keys);
    EXPECT_DOUBLE_EQ(a.device_ns, b.device_ns);
  }
}

TEST(Replay, Trn2ModelChargesOneLaunchPerFusedSegment) {
  Recording rec = record_loop(10, 8);
  auto t = fusion::prepare_replay(rec.events.data(), rec.events.size());
  auto o = options("default");
  o.cost.source = fusion::CostSource::kTrn2;
  auto r = fusion::replay(t, o);
  ASSERT_GT(r.occurrences_fused, 0u);
  for (const auto& k : r.keys)
    if (k.length >= 2) {
      EXPECT_LT(k.fused_ns, k.per_op_ns) << k.key;
    }
  auto never = o;
  never.policy = *fusion::builtin_policy("never");
  EXPECT_LT(r.device_ns, fusion::replay(t, never).device_ns);
}

TEST(Replay, HookReplacesTheCostGate) {
  Recording rec = record_loop(10, 8);
  auto t = fusion::prepare_replay(rec.events.data(), rec.events.size());
  auto o = options("default");
  int calls = 0;
  o.should_compile = [&](const fusion::ReplaySegment& s) {
    ++calls;
    EXPECT_GE(s.count, 3u);
    return false;
  };
  auto r = fusion::replay(t, o);
  EXPECT_GT(calls, 0);
  EXPECT_EQ(r.compiles, 0u);
}
