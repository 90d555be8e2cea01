#include "engine/guard_memory.h"

#include <string>

#include "backend/worker_threads.h"
#include "engine/recording.h"
#include "fusion/native.h"
#include "fusion/verdict_store.h"
#include "trace/counters.h"

namespace neuron::engine {
namespace {

trace::Counter g_remembered{"guard_remembered"};  // guards that started from a kept verdict

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
  if (!v) return false;
  guard.seed(v->verdict, v->ratio);
  ++g_remembered;
  return true;
}

void remember_verdict(const fusion::KeyGuard& guard, const fusion::GuardSettings& settings,
                      const fusion::GuardReport& report) {
  if (settings.remember) store().store(guard.key(), report);
}

}  // namespace neuron::engine
