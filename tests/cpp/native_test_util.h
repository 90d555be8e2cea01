// Helpers of the tier-2 cache tests (test_native_cache, test_cache_hygiene): temporary
// folders, cache entries, a hand-written kernel, and the shared compiler set up per test.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "fusion/native.h"
#include "fusion/native_cache.h"

namespace neuron::fusion::test_util {

namespace fs = std::filesystem;

// A fresh folder, removed with everything in it at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/neuron-cpp-cache-test-XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

inline std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// A committed entry whose object holds `bytes`.
inline void commit_entry(const NativeCache& cache, const std::string& key,
                         const std::string& bytes) {
  const std::string built = cache.object_path(key) + ".tmp.test";
  write_file(built, bytes);
  ASSERT_TRUE(cache.commit(key, built));
}

// out[i] = in[i] * s + i over [begin, end): enough to tell a loaded kernel ran.
inline std::string kernel_source(const std::string& tag) {
  return "// " + tag + "\n#include <cstdint>\nextern \"C\" void " + std::string(kNativeSymbol) +
         "(int64_t begin, int64_t end, char* const* p, const double* s) {\n"
         "  const float* in = reinterpret_cast<const float*>(p[0]);\n"
         "  float* out = reinterpret_cast<float*>(p[1]);\n"
         "  for (int64_t i = begin; i < end; ++i) out[i] = in[i] * static_cast<float>(s[0]) + i;\n"
         "}\n";
}

inline void expect_kernel_runs(NativeKernelFn fn) {
  ASSERT_NE(fn, nullptr);
  float in[4] = {1, 2, 3, 4}, out[4] = {};
  char* ptrs[2] = {reinterpret_cast<char*>(in), reinterpret_cast<char*>(out)};
  const double scale = 2;
  fn(0, 4, ptrs, &scale);
  EXPECT_EQ(out[0], 2.0f);
  EXPECT_EQ(out[3], 11.0f);
}

// Configures the shared compiler for one test and restores its options afterwards.
struct CompilerSetup {
  NativeOptions saved = NativeCompiler::instance().options();
  explicit CompilerSetup(const std::string& cache_dir, const std::string& compiler = "c++",
                         uint64_t cache_max_bytes = kDefaultCacheMaxBytes) {
    NativeOptions o;
    o.compiler = compiler;
    o.flags = {"-O1"};
    o.cache_dir = cache_dir;
    o.cache_max_bytes = cache_max_bytes;
    o.version = "test_native_cache";
    NativeCompiler::instance().configure(o);
    NativeCompiler::instance().reset_stats();
  }
  ~CompilerSetup() { NativeCompiler::instance().configure(saved); }
};

}  // namespace neuron::fusion::test_util
