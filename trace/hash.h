// XXH3 over words: the one hash function of the engine.
#pragma once

#include <cstddef>
#include <cstdint>

namespace neuron::trace {

uint64_t hash_bytes(const void* data, size_t bytes, uint64_t seed = 0);

// XXH3 of words with the words at the given (sorted) positions read as zero.
uint64_t hash_words_masked(const int64_t* words, size_t n, const uint32_t* masked, size_t n_masked);

inline uint64_t hash_words(const int64_t* words, size_t n, uint64_t seed = 0) {
  return hash_bytes(words, n * sizeof(int64_t), seed);
}

}  // namespace neuron::trace
