#include "trace/hash.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace neuron::trace {

uint64_t hash_bytes(const void* data, size_t bytes, uint64_t seed) {
  return XXH3_64bits_withSeed(data, bytes, seed);
}

}  // namespace neuron::trace
