#include <gtest/gtest.h>

#include "trace/hash.h"
#include "trace/shape_cache.h"

using namespace neuron::trace;

namespace {

OpRecord record(int64_t n) {
  OpRecord r;
  r.reset(7);
  TensorMeta m;
  m.defined = true;
  m.dtype = 6;
  m.ndim = 1;
  m.sizes[0] = n;
  m.strides[0] = 1;
  r.add_tensor(m);
  return r;
}

}  // namespace

TEST(ShapeCache, HitAfterInsertMissOtherwise) {
  ShapeCache cache;
  auto r = record(16);
  std::vector<TensorMeta> out;
  EXPECT_FALSE(cache.lookup(r, r.hash(), out));
  std::vector<TensorMeta> outputs(1, r.tensors[0]);
  cache.insert(r, r.hash(), outputs);
  ASSERT_TRUE(cache.lookup(r, r.hash(), out));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].same_geometry(r.tensors[0]));
  auto s = cache.stats();
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.misses, 1u);
}

TEST(ShapeCache, ForcedCollisionIsCaughtByVerification) {
  ShapeCache cache;
  auto a = record(16);
  auto b = record(32);
  const uint64_t forced_key = 42;  // both records claim the same hash
  cache.insert(a, forced_key, std::vector<TensorMeta>(1, a.tensors[0]));
  std::vector<TensorMeta> out;
  EXPECT_FALSE(cache.lookup(b, forced_key, out));
  EXPECT_EQ(cache.stats().collisions, 1u);
  EXPECT_TRUE(cache.lookup(a, forced_key, out));
}

TEST(Hash, Xxh3IsDeterministicAndSeedSensitive) {
  int64_t words[] = {1, 2, 3, 4};
  EXPECT_EQ(hash_words(words, 4), hash_words(words, 4));
  EXPECT_NE(hash_words(words, 4), hash_words(words, 3));
  EXPECT_NE(hash_words(words, 4, 0), hash_words(words, 4, 1));
}
