// XXH3 over words: the one hash function of the engine.
#pragma once

#include <cstddef>
#include <cstdint>

namespace neuron::trace {

uint64_t hash_bytes(const void* data, size_t bytes, uint64_t seed = 0);

inline uint64_t hash_words(const int64_t* words, size_t n, uint64_t seed = 0) {
  return hash_bytes(words, n * sizeof(int64_t), seed);
}

}  // namespace neuron::trace
