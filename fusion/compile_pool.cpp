// Background tier-2 builds: NativeCompiler::submit runs builds on a TBB task group that
// lives as long as the process.
#include <tbb/task_group.h>

#include <chrono>
#include <thread>

#include "fusion/native.h"

namespace neuron::fusion {
namespace {

tbb::task_group& pool() {
  // Never destroyed: a build still running at exit must not block or abort the exit.
  static auto* group = new tbb::task_group();
  return *group;
}

}  // namespace

void NativeCompiler::submit(std::string source, std::function<void(const NativeResult&)> done) {
  in_flight_.fetch_add(1);
  pool().run([this, source = std::move(source), done = std::move(done)] {
    NativeResult r;
    try {
      r = build(source);
    } catch (const std::exception& e) {
      r.error = std::string("native build failed: ") + e.what();
      failures_.fetch_add(1);
    }
    try {
      done(r);
    } catch (...) {
    }
    // This machine compiles kernels: later builds use the precompiled prelude (built once,
    // here, off every critical path).
    if (r.from == NativeResult::From::kCompiled) prelude_.prepare(options(), compiler_identity());
    in_flight_.fetch_sub(1);
  });
}

void NativeCompiler::wait_idle() {
  while (in_flight_.load() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

}  // namespace neuron::fusion
