// Host cost of recording and hashing one op, and of a shape-cache lookup.
#include <benchmark/benchmark.h>

#include "trace/op_record.h"
#include "trace/shape_cache.h"

using namespace neuron::trace;

namespace {

TensorMeta meta2d(int64_t a, int64_t b) {
  TensorMeta m;
  m.defined = true;
  m.dtype = 6;
  m.ndim = 2;
  m.sizes[0] = a;
  m.sizes[1] = b;
  m.strides[0] = b;
  m.strides[1] = 1;
  return m;
}

void record_binary(OpRecord& r, const TensorMeta& m) {
  r.reset(5);
  r.add_tensor(m);
  r.add_tensor(m);
  r.add_double(1.0);
}

void BM_RecordBinaryOp(benchmark::State& state) {
  OpRecord r;
  auto m = meta2d(64, 64);
  for (auto _ : state) {
    record_binary(r, m);
    benchmark::DoNotOptimize(r.signature.data());
  }
}
BENCHMARK(BM_RecordBinaryOp);

void BM_RecordAndHash(benchmark::State& state) {
  OpRecord r;
  auto m = meta2d(64, 64);
  for (auto _ : state) {
    record_binary(r, m);
    benchmark::DoNotOptimize(r.hash());
  }
}
BENCHMARK(BM_RecordAndHash);

void BM_ShapeCacheHit(benchmark::State& state) {
  ShapeCache cache;
  OpRecord r;
  auto m = meta2d(64, 64);
  record_binary(r, m);
  cache.insert(r, r.hash(), std::vector<TensorMeta>(1, m));
  std::vector<TensorMeta> out;
  out.reserve(4);
  for (auto _ : state) {
    benchmark::DoNotOptimize(cache.lookup(r, r.hash(), out));
  }
}
BENCHMARK(BM_ShapeCacheHit);

}  // namespace

BENCHMARK_MAIN();
