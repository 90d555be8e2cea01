#include "backend/tensor_alias.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>

namespace neuron::backend {
namespace {

void set_flags(at::Tensor& t, const trace::TensorMeta& m) {
  if (m.flags & trace::TensorMeta::kConjugate) t._set_conj(true);
  if (m.flags & trace::TensorMeta::kNegative) t._set_neg(true);
}

}  // namespace

void set_geometry(at::Tensor& t, const trace::TensorMeta& m) {
  t.unsafeGetTensorImpl()->set_sizes_and_strides(c10::IntArrayRef(m.sizes.data(), m.ndim),
                                                 c10::IntArrayRef(m.strides.data(), m.ndim),
                                                 m.storage_offset);
  set_flags(t, m);
}

bool describe_tensor(const at::Tensor& t, trace::TensorMeta& m) {
  if (!t.defined()) {
    m = trace::TensorMeta{};
    return true;
  }
  const int64_t ndim = t.dim();
  if (ndim > trace::kMaxDims) return false;
  m.defined = true;
  m.dtype = static_cast<int8_t>(t.scalar_type());
  m.ndim = static_cast<uint8_t>(ndim);
  m.device = t.device().is_cpu() ? -1 : static_cast<int8_t>(t.device().index());
  m.storage_offset = t.storage_offset();
  m.flags = static_cast<uint8_t>((t.is_conj() ? trace::TensorMeta::kConjugate : 0) |
                                 (t.is_neg() ? trace::TensorMeta::kNegative : 0) |
                                 (t.unsafeGetTensorImpl()->is_wrapped_number()
                                      ? trace::TensorMeta::kWrappedNumber
                                      : 0));
  m.storage = t.has_storage()
                  ? reinterpret_cast<uint64_t>(t.storage().unsafeGetStorageImpl())
                  : 0;
  auto sizes = t.sizes();
  auto strides = t.strides();
  for (int64_t i = 0; i < ndim; ++i) {
    m.sizes[i] = sizes[i];
    m.strides[i] = strides[i];
  }
  return true;
}

DeviceBuffer buffer_of(const c10::Storage& storage) {
  if (!storage) return {};
  return {const_cast<void*>(storage.data()), storage.nbytes(),
          reinterpret_cast<uint64_t>(storage.unsafeGetStorageImpl())};
}

at::Tensor cpu_alias(const c10::Storage& storage, const trace::TensorMeta& m) {
  return cpu_alias(buffer_of(storage), m);
}

at::Tensor cpu_alias(const DeviceBuffer& buffer, const trace::TensorMeta& m) {
  c10::Storage alias(c10::Storage::use_byte_size_t(), buffer.nbytes,
                     c10::DataPtr(buffer.data, c10::Device(c10::kCPU)),
                     /*allocator=*/nullptr, /*resizable=*/false);
  auto t = at::detail::make_tensor<c10::TensorImpl>(
      std::move(alias), c10::DispatchKeySet(c10::DispatchKey::CPU),
      c10::scalarTypeToTypeMeta(static_cast<c10::ScalarType>(m.dtype)));
  set_geometry(t, m);
  return t;
}

at::Tensor meta_tensor(const trace::TensorMeta& m) {
  c10::IntArrayRef sizes(m.sizes.data(), m.ndim), strides(m.strides.data(), m.ndim);
  auto options = at::TensorOptions()
                     .dtype(static_cast<c10::ScalarType>(m.dtype))
                     .device(c10::kMeta);
  if (m.storage_offset == 0) {
    at::Tensor t = at::empty_strided(sizes, strides, options);
    set_flags(t, m);
    return t;
  }
  int64_t extent = 1;
  for (int i = 0; i < m.ndim; ++i)
    if (m.sizes[i] == 0) extent = 0;
  if (extent != 0)
    for (int i = 0; i < m.ndim; ++i) extent += (m.sizes[i] - 1) * m.strides[i];
  auto base = at::empty({m.storage_offset + extent}, options);
  auto t = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(base.storage()),
                                                     base.key_set(), base.dtype());
  set_geometry(t, m);
  return t;
}

bool contiguous(const trace::TensorMeta& m) {
  int64_t expected = 1;
  for (int i = m.ndim - 1; i >= 0; --i) {
    if (m.sizes[i] != 1 && m.strides[i] != expected) return false;
    expected *= m.sizes[i];
  }
  return true;
}

}  // namespace neuron::backend
