// Device memory seen as tensors: a tensor's geometry as a trace::TensorMeta, the device
// memory a queued item uses (by address), and CPU or Meta tensors of a given geometry.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>

#include "trace/op_record.h"

namespace neuron::backend {

// Geometry and identity of a tensor; false when it cannot be described (too many dims).
bool describe_tensor(const at::Tensor& t, trace::TensorMeta& out);
// Device memory a queued item reads or writes, by address. Items own no device memory:
// the allocator frees stream-ordered (a block freed while queued work may still use it
// is reused only once that work ran, see backend::free_block), so queued work leaves the
// use counts of the program's storages alone, as on CPU (autograd accumulates a gradient
// in place only when nothing else holds its storage; a count that depended on how far
// the worker got made the op stream differ from run to run).
struct DeviceBuffer {
  void* data = nullptr;
  size_t nbytes = 0;
  uint64_t id = 0;  // the StorageImpl at dispatch (identity while the op is held)
  explicit operator bool() const { return id != 0; }
};
DeviceBuffer buffer_of(const c10::Storage& storage);

// A CPU tensor over the device memory with the given geometry; no copy, no ownership.
at::Tensor cpu_alias(const DeviceBuffer& buffer, const trace::TensorMeta& meta);
at::Tensor cpu_alias(const c10::Storage& storage, const trace::TensorMeta& meta);
// A Meta tensor with the given geometry (offset included).
at::Tensor meta_tensor(const trace::TensorMeta& meta);
// Gives t the geometry of meta: sizes, strides, storage offset and the conjugate and
// negative bits (t keeps its storage and dtype).
void set_geometry(at::Tensor& t, const trace::TensorMeta& meta);

// True when the geometry is row-major contiguous (size-1 dims may have any stride).
bool contiguous(const trace::TensorMeta& m);

}  // namespace neuron::backend
