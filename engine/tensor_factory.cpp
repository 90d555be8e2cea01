#include "engine/tensor_factory.h"

#include <ATen/EmptyTensor.h>
#include <c10/core/CachingDeviceAllocator.h>

#include <cstring>

#include "engine/engine.h"

namespace neuron::engine {

size_t bytes_needed(const trace::TensorMeta& m) {
  int64_t extent = 1;
  for (int i = 0; i < m.ndim; ++i)
    if (m.sizes[i] == 0) return 0;
  for (int i = 0; i < m.ndim; ++i) extent += (m.sizes[i] - 1) * m.strides[i];
  const auto itemsize = c10::elementSize(static_cast<c10::ScalarType>(m.dtype));
  return static_cast<size_t>(m.storage_offset + extent) * itemsize;
}

at::Tensor empty_like_meta(const trace::TensorMeta& m, c10::DeviceIndex device) {
  c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, device));
  return at::detail::empty_strided_generic(
      c10::IntArrayRef(m.sizes.data(), m.ndim), c10::IntArrayRef(m.strides.data(), m.ndim),
      c10::GetAllocator(c10::DeviceType::PrivateUse1),
      c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
      static_cast<c10::ScalarType>(m.dtype));
}

at::Tensor view_of(const at::Tensor& base, const trace::TensorMeta& m) {
  auto t = at::detail::make_tensor<c10::TensorImpl>(c10::TensorImpl::VIEW,
                                                     c10::Storage(base.storage()),
                                                     base.key_set(), base.dtype());
  t.unsafeGetTensorImpl()->set_sizes_and_strides(c10::IntArrayRef(m.sizes.data(), m.ndim),
                                                 c10::IntArrayRef(m.strides.data(), m.ndim),
                                                 m.storage_offset);
  if (m.flags & trace::TensorMeta::kConjugate) t._set_conj(true);
  if (m.flags & trace::TensorMeta::kNegative) t._set_neg(true);
  return t;
}

void ensure_storage_bytes(const at::Tensor& t, size_t bytes) {
  auto* storage = t.storage().unsafeGetStorageImpl();
  if (storage->nbytes() >= bytes) return;
  TORCH_CHECK(storage->resizable(), "neuron: cannot resize a storage that is not resizable");
  const c10::Device device = t.device();
  // Queued work may still read the old block; an empty one holds nothing to wait for
  // (torch.arange(n, device=...) resizes a fresh empty tensor on every call).
  if (storage->nbytes() > 0) synchronize(device.index(), "storage resize");
  c10::DeviceGuard guard(device);
  c10::DataPtr fresh = c10::GetAllocator(c10::DeviceType::PrivateUse1)->allocate(bytes);
  if (storage->nbytes() > 0 && storage->data() != nullptr)
    std::memcpy(fresh.get(), storage->data(), storage->nbytes());
  storage->set_data_ptr_noswap(std::move(fresh));
  storage->set_nbytes(bytes);
}

void set_geometry(const at::Tensor& t, const trace::TensorMeta& m) {
  ensure_storage_bytes(t, bytes_needed(m));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(c10::IntArrayRef(m.sizes.data(), m.ndim),
                                                 c10::IntArrayRef(m.strides.data(), m.ndim),
                                                 m.storage_offset);
}

}  // namespace neuron::engine
