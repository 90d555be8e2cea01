// The engine as the Python bindings and the rest of the engine see it.
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <string>

#include "backend/stream.h"
#include "engine/config.h"

namespace neuron::engine {

// Parses the environment and sets up the cores. Throws std::invalid_argument with one
// clear message for a bad NEURON_* value. Later calls return the first config.
const Config& init_from_env();
bool initialized();
const Config& config();

Mode mode();
void set_mode(Mode mode);
bool launch_blocking();
void set_launch_blocking(bool on);

int device_count();
// Throws a c10::Error naming the index and NEURON_CORES for an index out of range.
void check_device_index(c10::DeviceIndex index);
c10::DeviceIndex current_device();
void set_current_device(c10::DeviceIndex index);
// The current device of threads that never set one (and of the calling thread): under
// torchrun, LOCAL_RANK % device_count(), so each rank of a machine uses its own core.
void set_default_device(c10::DeviceIndex index);
int64_t current_stream_id(c10::DeviceIndex index);
void set_current_stream_id(c10::DeviceIndex index, int64_t id);
backend::Stream& current_stream(c10::DeviceIndex index);

// Waits for all work on a core (or all cores); a worker failure becomes a c10::Error
// naming the op.
// cause names the sync in traces ("item", "copy to host", ...).
void synchronize(c10::DeviceIndex index, const char* cause = "synchronize");
void synchronize_all(const char* cause = "synchronize");
void synchronize_stream(backend::Stream& stream, const char* cause = "stream synchronize");

const at::Generator& default_generator(c10::DeviceIndex index);
at::Generator new_generator(c10::DeviceIndex index);
// The CPU generator that actually draws the numbers for a neuron generator.
at::Generator host_generator_of(const at::Generator& gen);

// Counters for tests and the trace viewer.
struct Counters {
  uint64_t ops_dispatched = 0;
  uint64_t ops_queued = 0;
  uint64_t ops_synchronous = 0;  // ran at once (data-dependent shapes, no meta kernel, ...)
  uint64_t meta_runs = 0;
  uint64_t fast_meta_runs = 0;  // of meta_runs: geometry from C++ (engine/fast_meta.h)
  uint64_t shape_cache_hits = 0;
  uint64_t shape_cache_misses = 0;
  uint64_t views = 0;
  uint64_t syncs = 0;
};
Counters counters();
void reset_counters();
// Forgets every op's inferred output geometry (the next op of each signature runs meta).
void clear_shape_cache();

}  // namespace neuron::engine
