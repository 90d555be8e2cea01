// Adaptive-mode host cost per op in the torch-free layers: segmenter add + cut (with the
// segment key), trace-cache lookup, and window matching against ready programs' signatures
// (modelled on engine/adaptive_window.cpp, candidates filtered per op, and
// engine/adaptive_cut.cpp, words compared at the cut).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "trace/segmenter.h"
#include "trace/trace_cache.h"

using namespace neuron::trace;

namespace {

// A loop body of n elementwise ops, each reading the previous output and one external
// tensor, writing one fresh output: the shape of a LayerNorm + GELU + residual chain.
std::vector<SegmentOp> chain_ops(size_t n, uint64_t first_storage = 1000) {
  std::vector<SegmentOp> ops(n);
  for (size_t i = 0; i < n; ++i) {
    auto& op = ops[i];
    op.op = static_cast<OpId>(1 + i % 7);
    op.signature = 0x9e3779b97f4a7c15ull * (i % 7 + 1);
    op.inputs = {first_storage + i, 7};
    op.outputs = {first_storage + i + 1};
    op.seq = i;
  }
  return ops;
}

SegmentPolicy no_content_cut(uint32_t max_length) {
  SegmentPolicy p;
  p.max_length = max_length;
  p.use_rolling_cut = false;
  return p;
}

// add() per op with the default policy (rolling-hash cuts, ~1 in 16), flush at each cut.
void BM_SegmenterAddPerOp(benchmark::State& state) {
  auto ops = chain_ops(1024);
  Segmenter seg;
  size_t i = 0;
  for (auto _ : state) {
    if (auto reason = seg.add(ops[i])) benchmark::DoNotOptimize(seg.flush(*reason));
    i = (i + 1) % ops.size();
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_SegmenterAddPerOp);

// One segment of n ops: n adds and the cut (canonical words + XXH3 key), per op.
void BM_SegmenterAddAndCut(benchmark::State& state) {
  const auto n = static_cast<size_t>(state.range(0));
  auto ops = chain_ops(n);
  Segmenter seg(no_content_cut(static_cast<uint32_t>(n)));
  std::vector<bool> alive(n, true);
  for (auto _ : state) {
    for (const auto& op : ops) seg.add(op);
    benchmark::DoNotOptimize(seg.flush(CutReason::kMaxLength, alive));
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(n));
}
BENCHMARK(BM_SegmenterAddAndCut)->Arg(8)->Arg(32)->Arg(128);

// The segment key alone (make_segment), per op of the segment.
void BM_SegmentKey(benchmark::State& state) {
  const auto n = static_cast<size_t>(state.range(0));
  auto ops = chain_ops(n);
  for (auto _ : state) benchmark::DoNotOptimize(make_segment(ops, CutReason::kContent, {}));
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(n));
}
BENCHMARK(BM_SegmentKey)->Arg(8)->Arg(32)->Arg(128);

// A verified hit in the trace cache (key lookup + full-words comparison), per segment.
void BM_TraceCacheHit(benchmark::State& state) {
  auto segment = make_segment(chain_ops(static_cast<size_t>(state.range(0))),
                              CutReason::kContent, {});
  TraceCache cache;
  cache.observe(segment, 0);
  uint64_t now = 1;
  for (auto _ : state) benchmark::DoNotOptimize(cache.observe(segment, now++));
}
BENCHMARK(BM_TraceCacheHit)->Arg(8)->Arg(32)->Arg(128);

struct ReadyProgram {
  std::vector<uint64_t> signatures;
  std::vector<int64_t> words;
};

// Window matching per op: at a segment start the candidates whose first signature matches
// are picked, each later op drops the candidates that disagree, and the cut compares the
// full words. range(0) = segment length, range(1) = ready programs sharing the first op.
void BM_WindowMatch(benchmark::State& state) {
  const auto n = static_cast<size_t>(state.range(0));
  const auto k = static_cast<size_t>(state.range(1));
  auto ops = chain_ops(n);
  auto segment = make_segment(ops, CutReason::kContent, {});
  std::vector<std::shared_ptr<ReadyProgram>> ready;
  for (size_t c = 0; c < k; ++c) {
    auto p = std::make_shared<ReadyProgram>();
    for (const auto& op : ops) p->signatures.push_back(op.signature);
    p->words = segment.words;
    if (c + 1 < k) p->signatures[n / 2] ^= c + 1;  // the others diverge halfway
    ready.push_back(std::move(p));
  }
  std::vector<std::shared_ptr<ReadyProgram>> candidates;
  candidates.reserve(k);
  for (auto _ : state) {
    candidates = ready;
    for (size_t pos = 1; pos < n; ++pos) {
      const uint64_t sig = ops[pos].signature;
      std::erase_if(candidates, [&](const std::shared_ptr<ReadyProgram>& c) {
        return c->signatures.size() <= pos || c->signatures[pos] != sig;
      });
    }
    bool full = !candidates.empty() && candidates.front()->words == segment.words;
    benchmark::DoNotOptimize(full);
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(n));
}
BENCHMARK(BM_WindowMatch)->Args({8, 1})->Args({32, 1})->Args({32, 4})->Args({128, 4});

}  // namespace

BENCHMARK_MAIN();
