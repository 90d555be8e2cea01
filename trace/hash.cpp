#include "trace/hash.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace neuron::trace {

uint64_t hash_bytes(const void* data, size_t bytes, uint64_t seed) {
  return XXH3_64bits_withSeed(data, bytes, seed);
}

uint64_t hash_words_masked(const int64_t* words, size_t n, const uint32_t* masked,
                           size_t n_masked) {
  if (n_masked == 0) return hash_words(words, n);
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  size_t begin = 0;
  const int64_t zero = 0;
  for (size_t i = 0; i < n_masked; ++i) {
    const size_t at = masked[i];
    if (at >= n) break;
    XXH3_64bits_update(&state, words + begin, (at - begin) * sizeof(int64_t));
    XXH3_64bits_update(&state, &zero, sizeof(zero));
    begin = at + 1;
  }
  XXH3_64bits_update(&state, words + begin, (n - begin) * sizeof(int64_t));
  return XXH3_64bits_digest(&state);
}

}  // namespace neuron::trace
