// Device tensors made by the engine: fresh outputs and views over existing storage.
#pragma once

#include "engine/pch.h"
#include "trace/op_record.h"

namespace neuron::engine {

// A fresh neuron tensor with exactly the geometry of meta (offset ignored).
at::Tensor empty_like_meta(const trace::TensorMeta& meta, c10::DeviceIndex device);
// A neuron tensor sharing base's storage with meta's geometry.
at::Tensor view_of(const at::Tensor& base, const trace::TensorMeta& meta);
// Gives t meta's geometry, growing its storage (after a sync) when it is too small.
void set_geometry(const at::Tensor& t, const trace::TensorMeta& meta);
// Makes sure the storage of t holds at least bytes, keeping its contents.
void ensure_storage_bytes(const at::Tensor& t, size_t bytes);
size_t bytes_needed(const trace::TensorMeta& meta);

}  // namespace neuron::engine
