#include "trace/op_record.h"

#include <bit>
#include <cstring>

#include "trace/hash.h"

namespace neuron::trace {

int64_t TensorMeta::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= sizes[i];
  return n;
}

bool TensorMeta::same_geometry(const TensorMeta& o) const {
  if (dtype != o.dtype || ndim != o.ndim || defined != o.defined || flags != o.flags ||
      storage_offset != o.storage_offset)
    return false;
  for (int i = 0; i < ndim; ++i)
    if (sizes[i] != o.sizes[i] || strides[i] != o.strides[i]) return false;
  return true;
}

void append_meta_words(std::vector<int64_t>& w, const TensorMeta& m) {
  w.push_back((int64_t{m.flags} << 16) | (int64_t{m.dtype} << 8) | m.ndim);
  for (int i = 0; i < m.ndim; ++i) w.push_back(m.sizes[i]);
  for (int i = 0; i < m.ndim; ++i) w.push_back(m.strides[i]);
  w.push_back(m.storage_offset);
}

void OpRecord::reset(OpId id) {
  op = id;
  hashable = true;
  tensors.clear();
  signature.clear();
  lifted.clear();
  signature.push_back(id);
}

void OpRecord::add_tensor(const TensorMeta& meta) {
  tensors.push_back(meta);
  signature.push_back(static_cast<int64_t>(ArgTag::kTensor));
  signature.push_back(meta.device);
  append_meta_words(signature, meta);
}

void OpRecord::add_undefined_tensor() {
  TensorMeta m;
  m.defined = false;
  tensors.push_back(m);
  signature.push_back(static_cast<int64_t>(ArgTag::kUndefinedTensor));
}

void OpRecord::add_none() { signature.push_back(static_cast<int64_t>(ArgTag::kNone)); }

void OpRecord::add_int(int64_t v) {
  signature.push_back(static_cast<int64_t>(ArgTag::kInt));
  signature.push_back(v);
}

void OpRecord::add_double(double v) {
  signature.push_back(static_cast<int64_t>(ArgTag::kDouble));
  signature.push_back(std::bit_cast<int64_t>(v));
}

void OpRecord::add_bool(bool v) {
  signature.push_back(static_cast<int64_t>(ArgTag::kBool));
  signature.push_back(v ? 1 : 0);
}

void OpRecord::add_complex(double re, double im) {
  signature.push_back(static_cast<int64_t>(ArgTag::kComplex));
  signature.push_back(std::bit_cast<int64_t>(re));
  signature.push_back(std::bit_cast<int64_t>(im));
}

void OpRecord::add_int_list(const int64_t* values, size_t n) {
  signature.push_back(static_cast<int64_t>(ArgTag::kIntList));
  signature.push_back(static_cast<int64_t>(n));
  signature.insert(signature.end(), values, values + n);
}

void OpRecord::add_double_list(const double* values, size_t n) {
  signature.push_back(static_cast<int64_t>(ArgTag::kDoubleList));
  signature.push_back(static_cast<int64_t>(n));
  for (size_t i = 0; i < n; ++i) signature.push_back(std::bit_cast<int64_t>(values[i]));
}

void OpRecord::add_bool_list(const bool* values, size_t n) {
  signature.push_back(static_cast<int64_t>(ArgTag::kBoolList));
  signature.push_back(static_cast<int64_t>(n));
  for (size_t i = 0; i < n; ++i) signature.push_back(values[i] ? 1 : 0);
}

void OpRecord::add_string(std::string_view s) {
  signature.push_back(static_cast<int64_t>(ArgTag::kString));
  signature.push_back(static_cast<int64_t>(s.size()));
  signature.push_back(static_cast<int64_t>(hash_bytes(s.data(), s.size())));
}

void OpRecord::add_scalar_type(int64_t code) {
  signature.push_back(static_cast<int64_t>(ArgTag::kScalarType));
  signature.push_back(code);
}

void OpRecord::add_device(int64_t type, int64_t index) {
  signature.push_back(static_cast<int64_t>(ArgTag::kDevice));
  signature.push_back((type << 16) | (index & 0xffff));
}

void OpRecord::begin_list(size_t n) {
  signature.push_back(static_cast<int64_t>(ArgTag::kListBegin));
  signature.push_back(static_cast<int64_t>(n));
}

void OpRecord::end_list() { signature.push_back(static_cast<int64_t>(ArgTag::kListEnd)); }

void OpRecord::add_opaque() {
  hashable = false;
  signature.push_back(static_cast<int64_t>(ArgTag::kOpaque));
}

uint64_t OpRecord::hash() const { return hash_words(signature.data(), signature.size()); }

uint64_t OpRecord::lifted_hash() const {
  return hash_words_masked(signature.data(), signature.size(), lifted.data(), lifted.size());
}

}  // namespace neuron::trace
