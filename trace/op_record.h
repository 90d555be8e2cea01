// What one dispatched op looked like: its id, the geometry of its tensors and its
// non-tensor arguments, flattened into signature words that hash and compare fast.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

namespace neuron::trace {

using OpId = uint32_t;
inline constexpr int kMaxDims = 16;

// Geometry of one tensor argument. dtype is the producer's dtype code (c10::ScalarType
// in the engine); this layer only compares it.
struct TensorMeta {
  static constexpr uint8_t kConjugate = 1, kNegative = 2, kWrappedNumber = 4;

  int8_t dtype = -1;
  uint8_t ndim = 0;
  int8_t device = -1;  // core index; -1 for host tensors
  bool defined = false;
  uint8_t flags = 0;  // kConjugate | kNegative (lazy views) | kWrappedNumber (Python scalar)
  int64_t storage_offset = 0;
  uint64_t storage = 0;  // identity of the storage (dataflow); not part of the signature
  std::array<int64_t, kMaxDims> sizes{};
  std::array<int64_t, kMaxDims> strides{};

  int64_t numel() const;
  bool same_geometry(const TensorMeta& other) const;
};

// Tags that open each argument in the signature, so that differently typed arguments
// with equal payloads never collide.
enum class ArgTag : int64_t {
  kTensor = 0x7e500001,
  kUndefinedTensor,
  kNone,
  kInt,
  kDouble,
  kBool,
  kComplex,
  kIntList,
  kDoubleList,
  kBoolList,
  kString,
  kScalarType,
  kDevice,
  kListBegin,
  kListEnd,
  kOpaque,
};

struct OpRecord {
  OpId op = 0;
  bool hashable = true;             // false when an argument has no stable encoding
  std::vector<TensorMeta> tensors;  // tensor arguments in schema order, lists flattened
  std::vector<int64_t> signature;   // canonical words: op id, then tag + payload per argument
  std::vector<uint32_t> lifted;     // positions of scalar values a fused program takes as inputs

  void reset(OpId id);
  void add_tensor(const TensorMeta& meta);
  void add_undefined_tensor();
  void add_none();
  void add_int(int64_t v);
  void add_double(double v);
  void add_bool(bool v);
  void add_complex(double re, double im);
  void add_int_list(const int64_t* values, size_t n);
  void add_double_list(const double* values, size_t n);
  void add_bool_list(const bool* values, size_t n);
  void add_string(std::string_view s);
  void add_scalar_type(int64_t code);
  void add_device(int64_t type, int64_t index);
  void begin_list(size_t n);
  void end_list();
  void add_opaque();  // marks the record unhashable

  // XXH3-64 of the signature words.
  uint64_t hash() const;
  // Marks the last word as a liftable scalar value (Scalar and float arguments).
  void lift_last() { lifted.push_back(static_cast<uint32_t>(signature.size() - 1)); }
  // The hash with lifted scalar values read as zero: one key for every value.
  uint64_t lifted_hash() const;
};

// Appends the signature words of one tensor's geometry (dtype, rank, sizes, strides, offset).
void append_meta_words(std::vector<int64_t>& words, const TensorMeta& meta);

}  // namespace neuron::trace
