// The row reductions row kernels carry as source text (codegen_rows.cpp pastes it after
// the prelude): a row's moments as ATen's layer norm takes them, and a row's sum as its sum
// kernel does, in their orders of operations, so the bits match.
#include "fusion/codegen_formulas.h"

namespace neuron::fusion::detail {
namespace {

// Row moments (mean, biased variance) computed as ATen's layer-norm kernel does: Welford
// over chunks of up to 16 vectors of 32 bytes, chunk results merged along a binary
// counter, the elements past the last whole vector one by one, then the lanes merged in
// order. ATen registers no AVX-512 build of that kernel, so on AVX-512 CPUs it runs its
// AVX2 one: the vectors here are 32 bytes wide whatever Vec is.
constexpr const char* kRowMoments = R"(namespace {
#if defined(CPU_CAPABILITY_AVX512)
struct MV { __m256@r v; };
constexpr int64_t kML = 32 / sizeof(T);
inline MV mv_set(T s) { return {_mm256_set1_@p(s)}; }
inline MV mv_load(const T* p) { return {_mm256_loadu_@p(p)}; }
inline void mv_store(MV a, T* p) { _mm256_storeu_@p(p, a.v); }
inline MV operator+(MV a, MV b) { return {_mm256_add_@p(a.v, b.v)}; }
inline MV operator-(MV a, MV b) { return {_mm256_sub_@p(a.v, b.v)}; }
inline MV operator*(MV a, MV b) { return {_mm256_mul_@p(a.v, b.v)}; }
inline MV mv_fma(MV a, MV b, MV c) { return {_mm256_fmadd_@p(a.v, b.v, c.v)}; }
#else
using MV = Vec;
constexpr int64_t kML = Vec::size();
inline MV mv_set(T s) { return Vec(s); }
inline MV mv_load(const T* p) { return Vec::loadu(p); }
inline void mv_store(MV a, T* p) { a.store(p); }
inline MV mv_fma(MV a, MV b, MV c) { return at::vec::fmadd(a, b, c); }
#endif
// Adds the moments (an, a1, a2) of `an` elements to (n0, m1, m2).
inline void mv_merge(int64_t an, MV a1, MV a2, int64_t& n0, MV& m1, MV& m2) {
  const int64_t n = n0 + an;
  const T c = n == 0 ? T(0) : static_cast<T>(an) / static_cast<T>(n);
  const MV cv = mv_set(c);
  const MV d = a1 - m1;
  const MV sum2 = m2 + a2;
  const MV cd = cv * d;
  const MV nd = d * mv_set(static_cast<T>(n0));
  m1 = m1 + cd;
  m2 = mv_fma(nd, cd, sum2);
  n0 = n;
}
inline void s_merge(int64_t an, T a1, T a2, int64_t& n0, T& m1, T& m2) {
  const int64_t n = n0 + an;
  const T c = n == 0 ? T(0) : static_cast<T>(an) / static_cast<T>(n);
  const T d = a1 - m1;
  m1 += c * d;
  m2 += a2 + d * d * c * static_cast<T>(n0);
  n0 = n;
}
inline void row_moments(const T* x, int64_t N, T& mean, T& var) {
  const int64_t nv = N / kML;
  const int64_t chunks = (nv + 15) / 16;
  const int64_t depth = chunks <= 2 ? 1 : 64 - __builtin_clzll(static_cast<unsigned long long>(chunks - 1));
  static const auto inv = [] {
    std::array<MV, 16> r;
    for (int j = 0; j < 16; ++j) r[j] = mv_set(T(1) / static_cast<T>(j + 1));
    return r;
  }();
  int64_t sn[64];
  MV s1[64], s2[64];
  for (int64_t i = 0; i < depth; ++i) sn[i] = 0, s1[i] = mv_set(T(0)), s2[i] = mv_set(T(0));
  for (int64_t i = 0; i < chunks; ++i) {
    const T* p = x + i * 16 * kML;
    const int64_t cnt = std::min<int64_t>(16, nv - i * 16);
    MV a1 = mv_set(T(0)), a2 = mv_set(T(0));
    for (int64_t j = 0; j < cnt; ++j) {
      const MV v = mv_load(p + j * kML);
      const MV d = v - a1;
      a1 = mv_fma(inv[j], d, a1);
      const MV d2 = v - a1;
      a2 = mv_fma(d, d2, a2);
    }
    mv_merge(cnt, a1, a2, sn[0], s1[0], s2[0]);
    for (int64_t j = 1, mask = i + 1; j < depth && (mask & 1) == 0; ++j, mask >>= 1) {
      mv_merge(sn[j - 1], s1[j - 1], s2[j - 1], sn[j], s1[j], s2[j]);
      sn[j - 1] = 0, s1[j - 1] = mv_set(T(0)), s2[j - 1] = mv_set(T(0));
    }
  }
  for (int64_t i = 1; i < depth; ++i) mv_merge(sn[i], s1[i], s2[i], sn[0], s1[0], s2[0]);
  T l1[kML], l2[kML];
  mv_store(s1[0], l1);
  mv_store(s2[0], l2);
  int64_t n0 = 0;
  T m1 = 0, m2 = 0;
  for (int64_t i = nv * kML; i < N; ++i) {
    const T v = x[i];
    const T d = v - m1;
    ++n0;
    m1 += d / static_cast<T>(n0);
    m2 += d * (v - m1);
  }
  for (int64_t l = 0; l < kML; ++l) s_merge(nv, l1[l], l2[l], n0, m1, m2);
  mean = m1;
  var = m2 / static_cast<T>(N);
}
// A row's sum as ATen's sum kernel takes it over a contiguous last dim (its AVX2 build,
// on AVX-512 CPUs too): 32-byte vectors in groups of four, summed in a cascade of four
// levels, the leftover vectors, the four partial vectors, then the elements past the last
// whole vector and the lanes in order, into a zeroed output. Adds only: lanes as arrays.
inline T row_sum(const T* x, int64_t N) {
  constexpr int64_t L = 32 / sizeof(T);
  const int64_t nv = N / L, n4 = nv / 4;
  const int64_t lg = n4 <= 2 ? 1 : 64 - __builtin_clzll(static_cast<unsigned long long>(n4 - 1));
  const int64_t power = std::max<int64_t>(4, lg / 4), step = int64_t{1} << power, mask = step - 1;
  T acc[4][4][L] = {};
  auto add_group = [&](int64_t g) {
    for (int k = 0; k < 4; ++k)
      for (int l = 0; l < L; ++l) acc[0][k][l] += x[(g * 4 + k) * L + l];
  };
  int64_t i = 0;
  while (i + step <= n4) {
    for (int64_t j = 0; j < step; ++j, ++i) add_group(i);
    for (int j = 1; j < 4; ++j) {
      for (int k = 0; k < 4; ++k)
        for (int l = 0; l < L; ++l) acc[j][k][l] += acc[j - 1][k][l], acc[j - 1][k][l] = T(0);
      if ((i & (mask << (j * power))) != 0) break;
    }
  }
  for (; i < n4; ++i) add_group(i);
  for (int j = 1; j < 4; ++j)
    for (int k = 0; k < 4; ++k)
      for (int l = 0; l < L; ++l) acc[0][k][l] += acc[j][k][l];
  for (int64_t v = n4 * 4; v < nv; ++v)
    for (int l = 0; l < L; ++l) acc[0][0][l] += x[v * L + l];
  for (int k = 1; k < 4; ++k)
    for (int l = 0; l < L; ++l) acc[0][0][l] += acc[0][k][l];
  T total = 0;
  for (int64_t e = nv * L; e < N; ++e) total += x[e];
  for (int l = 0; l < L; ++l) total += acc[0][0][l];
  T out = 0;
  out += total;
  return out;
}
}  // namespace
)";

}  // namespace

const char* row_math_source() { return kRowMoments; }

}  // namespace neuron::fusion::detail
