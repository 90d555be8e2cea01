// The guard's verdicts across processes (fusion/verdict_store.h): kept in the cache folder
// under the active policy and thread count, looked up when a key or family gets its guard.
#pragma once

#include <cstdint>

#include "fusion/guard.h"

namespace neuron::engine {

// Seeds a new guard from a kept demotion of its key under the active policy (it starts
// per op, re-tried with backoff); whether one was found (counter guard_remembered).
bool seed_from_memory(fusion::KeyGuard& guard, const fusion::GuardSettings& settings);
// Keeps a demotion of the guard's key, or drops a kept one when the key is kept now (a
// file write; called once per trial).
void remember_verdict(const fusion::KeyGuard& guard, const fusion::GuardSettings& settings,
                      const fusion::GuardReport& report);

}  // namespace neuron::engine
