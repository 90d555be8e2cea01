// The machine's memory-bandwidth roofline: STREAM copy, scale, add and triad over arrays
// far larger than the last-level cache, on one thread and on every core. The DRAM-sized
// fused chain is measured against the best of these (bench/python/roofline.py reads the
// JSON output: --benchmark_format=json).
#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstring>
#include <thread>
#include <vector>

namespace {

enum Kernel { kCopy, kScale, kAdd, kTriad };

// Each thread streams its own arrays (first-touched by that thread), so the figure is the
// machine's aggregate bandwidth.
template <Kernel K>
void BM_Stream(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0)) / sizeof(double);
  std::vector<double> a(n, 1.0), b(n, 2.0), c(n, 0.0);
  const double s = 3.0;
  for (auto _ : state) {
    double* __restrict pa = a.data();
    const double* __restrict pb = b.data();
    double* __restrict pc = c.data();
    for (size_t i = 0; i < n; ++i) {
      if constexpr (K == kCopy) pc[i] = pa[i];
      if constexpr (K == kScale) pc[i] = s * pb[i];
      if constexpr (K == kAdd) pc[i] = pa[i] + pb[i];
      if constexpr (K == kTriad) pc[i] = pa[i] + s * pb[i];
    }
    benchmark::DoNotOptimize(pc);
    benchmark::ClobberMemory();
  }
  const int64_t arrays = (K == kCopy || K == kScale) ? 2 : 3;  // read + written
  state.SetBytesProcessed(state.iterations() * arrays * state.range(0));
}

void sizes(benchmark::internal::Benchmark* b) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  b->Arg(int64_t{16} << 20)->Arg(int64_t{256} << 20)->Threads(1);  // args x threads
  if (cores > 1) b->Threads(cores);
  b->UseRealTime()->Unit(benchmark::kMillisecond);
}

BENCHMARK(BM_Stream<kCopy>)->Name("BM_StreamCopy")->Apply(sizes);
BENCHMARK(BM_Stream<kScale>)->Name("BM_StreamScale")->Apply(sizes);
BENCHMARK(BM_Stream<kAdd>)->Name("BM_StreamAdd")->Apply(sizes);
BENCHMARK(BM_Stream<kTriad>)->Name("BM_StreamTriad")->Apply(sizes);

}  // namespace

BENCHMARK_MAIN();
