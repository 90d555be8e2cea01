#include "engine/guard_memory.h"

#include <string>

#include "backend/worker_threads.h"
#include "engine/recording.h"
#include "fusion/native.h"
#include "fusion/verdict_store.h"
#include "trace/counters.h"

namespace neuron::engine {
namespace {

trace::Counter g_remembered{"guard_remembered"};  // guards that started from a kept demotion

fusion::VerdictStore store() {
  // A verdict holds for the policy it was measured under and the worker's thread count.
  const std::string context = fusion::policy_json(active_policy()) +
                              " threads=" + std::to_string(backend::large_item_threads());
  return fusion::VerdictStore(fusion::NativeCompiler::instance().options().cache_dir, context);
}

}  // namespace

bool seed_from_memory(fusion::KeyGuard& guard, const fusion::GuardSettings& settings) {
  if (!settings.remember) return false;
  const auto v = store().load(guard.key());
  if (!v || v->verdict == fusion::GuardVerdict::kKeep) return false;
  guard.seed(v->verdict, v->ratio);
  ++g_remembered;
  return true;
}

void remember_verdict(const fusion::KeyGuard& guard, const fusion::GuardSettings& settings,
                      const fusion::GuardReport& report) {
  if (!settings.remember) return;
  // Only demotions are kept. A trial that ends in one costs fused occurrences slower than
  // per-op runs, which the next process skips; a kept key's trial costs per-op runs at
  // most (eager's speed), while a kept verdict applied at once to a family in another
  // process fused members its trial never saw (robust.py decode, reads every step, warm:
  // 0.71-0.79 ms a step starting kept families fused, 0.44-0.75 trying them).
  if (report.verdict == fusion::GuardVerdict::kKeep)
    store().forget(guard.key());
  else
    store().store(guard.key(), report);
}

}  // namespace neuron::engine
