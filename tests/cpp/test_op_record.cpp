#include <gtest/gtest.h>

#include "trace/op_record.h"
#include "trace/op_registry.h"

using namespace neuron::trace;

namespace {

TensorMeta meta(std::initializer_list<int64_t> sizes, int8_t dtype = 6) {
  TensorMeta m;
  m.defined = true;
  m.dtype = dtype;
  m.ndim = static_cast<uint8_t>(sizes.size());
  int64_t stride = 1;
  int i = static_cast<int>(sizes.size()) - 1;
  std::vector<int64_t> s(sizes);
  for (; i >= 0; --i) {
    m.sizes[i] = s[i];
    m.strides[i] = stride;
    stride *= s[i];
  }
  m.device = 0;
  return m;
}

OpRecord add_record(const TensorMeta& a, const TensorMeta& b, double alpha) {
  OpRecord r;
  r.reset(OpRegistry::instance().intern("aten::add.Tensor"));
  r.add_tensor(a);
  r.add_tensor(b);
  r.add_double(alpha);
  return r;
}

}  // namespace

TEST(OpRecord, SameInputsSameSignatureAndHash) {
  auto r1 = add_record(meta({4, 4}), meta({4, 4}), 1.0);
  auto r2 = add_record(meta({4, 4}), meta({4, 4}), 1.0);
  EXPECT_EQ(r1.signature, r2.signature);
  EXPECT_EQ(r1.hash(), r2.hash());
  EXPECT_EQ(r1.tensors.size(), 2u);
}

TEST(OpRecord, ShapeDtypeStrideOffsetAndScalarChangeTheHash) {
  const auto base = add_record(meta({4, 4}), meta({4, 4}), 1.0).hash();
  EXPECT_NE(base, add_record(meta({4, 5}), meta({4, 4}), 1.0).hash());
  EXPECT_NE(base, add_record(meta({4, 4}, 7), meta({4, 4}), 1.0).hash());
  auto strided = meta({4, 4});
  strided.strides[0] = 1;
  strided.strides[1] = 4;
  EXPECT_NE(base, add_record(strided, meta({4, 4}), 1.0).hash());
  auto offset = meta({4, 4});
  offset.storage_offset = 16;
  EXPECT_NE(base, add_record(offset, meta({4, 4}), 1.0).hash());
  EXPECT_NE(base, add_record(meta({4, 4}), meta({4, 4}), 2.0).hash());
}

TEST(OpRecord, StorageIdentityIsNotPartOfTheSignature) {
  auto a = meta({8});
  auto b = meta({8});
  b.storage = 1234;
  EXPECT_EQ(add_record(a, a, 1.0).hash(), add_record(b, b, 1.0).hash());
}

TEST(OpRecord, ArgumentKindsDoNotCollide) {
  OpRecord a, b;
  a.reset(1);
  a.add_int(1);
  b.reset(1);
  b.add_bool(true);
  EXPECT_NE(a.signature, b.signature);
  OpRecord c, d;
  c.reset(1);
  int64_t two[] = {1, 2};
  c.add_int_list(two, 2);
  d.reset(1);
  d.add_int(1);
  d.add_int(2);
  EXPECT_NE(c.hash(), d.hash());
}

TEST(OpRecord, OpaqueArgumentsMakeARecordUnhashable) {
  OpRecord r;
  r.reset(3);
  EXPECT_TRUE(r.hashable);
  r.add_opaque();
  EXPECT_FALSE(r.hashable);
  r.reset(3);
  EXPECT_TRUE(r.hashable);
}

TEST(OpRegistry, InternIsStableAndNamed) {
  auto& reg = OpRegistry::instance();
  OpId a = reg.intern("aten::mul.Tensor");
  OpId b = reg.intern("aten::mul.Tensor");
  OpId c = reg.intern("aten::div.Tensor");
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_EQ(reg.name(a), "aten::mul.Tensor");
  EXPECT_EQ(reg.name(0), "<unknown op>");
}
