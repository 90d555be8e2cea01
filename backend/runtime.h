// The simulated NeuronCores: the one interface the engine uses to reach device memory
// and queues. A real Neuron runtime would sit behind these same calls.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/device_memory.h"
#include "backend/stream.h"

namespace neuron::backend {

inline constexpr int kMaxStreamsPerCore = 32;
// The stream collectives run on (distributed/), kept out of new_stream's pool like NCCL's
// internal streams, so a user's stream never waits behind another rank.
inline constexpr int64_t kCollectiveStream = kMaxStreamsPerCore - 1;

struct RuntimeConfig {
  int cores = 2;
  size_t hbm_bytes = size_t{8} << 30;
};

// Sets up the cores once; later calls are ignored. Returns false if already set up.
bool init(const RuntimeConfig& config);
bool initialized();
int core_count();
size_t hbm_bytes();
DeviceMemory& memory(int core);
// Stream id 0 is the core's default stream; others come from new_stream.
Stream& stream(int core, int64_t id);
// A stream id from the core's pool (created on first use, then reused round-robin; never
// kCollectiveStream).
int64_t new_stream(int core);
// Waits for every stream of the core; rethrows the first worker error.
void synchronize_core(int core);
// Waits for every stream of the core without raising (errors stay for the next sync).
void drain_core(int core);
void synchronize_all();
// Frees a device block stream-ordered: queued items hold addresses, not references, so
// a block freed while its core has queued work becomes reusable only once every stream
// of the core ran what was queued before the free (frees are never made to wait).
void free_block(void* ptr);
// Makes retired blocks whose work ran reusable (the allocator calls it before allocating;
// after a drain every retired block of the core qualifies).
void reclaim_blocks(int core);
int64_t pending_work(int core);
// The device's busy time: nanoseconds the workers of the core's streams spent running
// items, since they began or reset_busy_time().
int64_t busy_time_ns(int core);
void reset_busy_time();

}  // namespace neuron::backend
