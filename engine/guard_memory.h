// The guard's verdicts across processes (fusion/verdict_store.h): kept in the cache folder
// under the active policy and thread count, looked up when a key or family gets its guard.
#pragma once

#include <cstdint>

#include "fusion/guard.h"

namespace neuron::engine {

// Seeds a new guard from a kept verdict of its key under the active policy; whether one
// was found (counter guard_remembered).
bool seed_from_memory(fusion::KeyGuard& guard, const fusion::GuardSettings& settings);
// Keeps a final verdict of the guard's key (a file write; called once per trial).
void remember_verdict(const fusion::KeyGuard& guard, const fusion::GuardSettings& settings,
                      const fusion::GuardReport& report);

}  // namespace neuron::engine
