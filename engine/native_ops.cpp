// Native neuron kernels for the ops the fallback cannot serve: allocation, views,
// metadata changes, copies across devices, host reads and dropout's RNG.
#include <ATen/EmptyTensor.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <ATen/ops/_reshape_alias_native.h>

#include "backend/op_work.h"
#include "backend/runtime.h"
#include "engine/counters.h"
#include "engine/dispatch.h"
#include "engine/engine.h"
#include "engine/recording.h"
#include "engine/stream_state.h"
#include "engine/pch.h"
#include "engine/tensor_factory.h"

namespace neuron::engine {
namespace {

constexpr auto kNeuron = c10::DeviceType::PrivateUse1;

c10::Device target_device(std::optional<c10::Device> device) {
  c10::Device d = device.value_or(c10::Device(kNeuron, current_device()));
  TORCH_CHECK(d.type() == kNeuron, "neuron: expected a neuron device, got ", d);
  return d.has_index() ? d : c10::Device(kNeuron, current_device());
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout,
                               std::optional<c10::Device> device, std::optional<bool>,
                               std::optional<c10::MemoryFormat> memory_format) {
  TORCH_CHECK(!layout || *layout == c10::kStrided, "neuron: only strided tensors are supported");
  c10::DeviceGuard guard(target_device(device));
  return at::detail::empty_generic(size, c10::GetAllocator(kNeuron),
                                   c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                         std::optional<c10::Device> device, std::optional<bool>) {
  TORCH_CHECK(!layout || *layout == c10::kStrided, "neuron: only strided tensors are supported");
  c10::DeviceGuard guard(target_device(device));
  return at::detail::empty_strided_generic(size, stride, c10::GetAllocator(kNeuron),
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<c10::MemoryFormat> memory_format) {
  auto* impl = self.unsafeGetTensorImpl();
  if (self.sizes() != size || memory_format) {
    impl->set_sizes_contiguous(size);
    const size_t itemsize = self.dtype().itemsize();
    ensure_storage_bytes(self, static_cast<size_t>(self.storage_offset() + self.numel()) * itemsize);
    if (memory_format) impl->empty_tensor_restride(*memory_format);
  }
  return self;
}

at::Tensor& set_storage_offset(at::Tensor& self, c10::Storage source, int64_t offset,
                               c10::IntArrayRef size, c10::IntArrayRef stride) {
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_storage_keep_dtype(std::move(source));
  trace::TensorMeta m;
  m.dtype = static_cast<int8_t>(self.scalar_type());
  m.ndim = static_cast<uint8_t>(size.size());
  m.storage_offset = offset;
  c10::DimVector contiguous;
  if (stride.empty()) {
    contiguous = c10::contiguous_strides(size);
    stride = contiguous;
  }
  TORCH_CHECK(size.size() <= trace::kMaxDims, "neuron: too many dimensions");
  for (size_t i = 0; i < size.size(); ++i) {
    m.sizes[i] = size[i];
    m.strides[i] = stride[i];
  }
  set_geometry(self, m);
  return self;
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source) {
  const int64_t n = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return set_storage_offset(self, std::move(source), 0, {n}, {});
}

at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& source) {
  if (self.is_same(source)) return self;
  return set_storage_offset(self, source.storage(), source.storage_offset(), source.sizes(),
                            source.strides());
}

at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage empty(c10::Storage::use_byte_size_t(), 0, c10::GetAllocator(kNeuron)->allocate(0),
                     c10::GetAllocator(kNeuron), true);
  return set_storage_offset(self, std::move(empty), 0, {0}, {});
}

at::Tensor alias_of(const at::Tensor& t) {
  trace::TensorMeta m;
  TORCH_CHECK(backend::describe_tensor(t, m), "neuron: too many dimensions");
  return backend::cpu_alias(t.storage(), m);
}

// Copies one neuron tensor into another on the destination's stream.
class CopyWork final : public backend::WorkItem {
 public:
  void run() override {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    at::Tensor dst = backend::cpu_alias(dst_storage, dst_meta);
    dst.copy_(src_storage ? backend::cpu_alias(src_storage, src_meta) : host);
  }
  std::string describe() const override { return "aten::copy_"; }
  backend::DeviceBuffer dst_storage, src_storage;
  trace::TensorMeta dst_meta, src_meta;
  at::Tensor host;
};

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool /*non_blocking*/) {
  const bool src_neuron = self.device().type() == kNeuron;
  const bool dst_neuron = dst.device().type() == kNeuron;
  if (self.numel() == 0 && dst.numel() == 0) return dst;
  if (src_neuron && dst_neuron && self.device().index() == dst.device().index()) {
    // On one core: a recorded op like any other (copy_ into dst), so it joins segments
    // instead of closing them (autograd's slice and select backward copy into zeros).
    static const c10::OperatorHandle copy_op =
        c10::Dispatcher::singleton().findSchemaOrThrow("aten::copy_", "");
    torch::jit::Stack stack{c10::IValue(dst), c10::IValue(self), c10::IValue(false)};
    neuron_fallback(copy_op, &stack);
    return dst;
  }
  // Copies are queued directly: ops held in an adaptive window must go first.
  if (src_neuron) flush_windows(self.device().index());
  if (dst_neuron && (!src_neuron || dst.device().index() != self.device().index()))
    flush_windows(dst.device().index());
  if (src_neuron && !dst_neuron) {
    // Device to host: the host read waits for the queue.
    synchronize(self.device().index(), "copy to host");
    dst.copy_(alias_of(self));
    return dst;
  }
  TORCH_CHECK(dst_neuron, "neuron: unexpected copy from ", self.device(), " to ", dst.device());
  const c10::DeviceIndex index = dst.device().index();
  if (src_neuron && self.device().index() != index) {
    // Between cores: both queues drain, then a direct copy.
    synchronize(self.device().index(), "copy between cores");
    synchronize(index, "copy between cores");
    alias_of(dst).copy_(alias_of(self));
    return dst;
  }
  backend::Stream& stream = current_stream(index);
  if (!src_neuron && backend::pending_work(index) == 0) {
    // Idle core: copy now, no staging.
    alias_of(dst).copy_(self);
    return dst;
  }
  auto work = std::make_unique<CopyWork>();
  TORCH_CHECK(backend::describe_tensor(dst, work->dst_meta), "neuron: too many dimensions");
  work->dst_storage = backend::buffer_of(dst.storage());
  if (src_neuron) {
    TORCH_CHECK(backend::describe_tensor(self, work->src_meta), "neuron: too many dimensions");
    work->src_storage = backend::buffer_of(self.storage());
  } else {
    // Host to device while work is queued: snapshot the host data now.
    work->host = self.clone();
  }
  stream.enqueue(std::move(work));
  bump(g_counters.ops_queued);
  if (launch_blocking()) synchronize_stream(stream);
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  resize_(dst, self.sizes(), std::nullopt);
  return copy_from(self, dst, false);
}

c10::Scalar local_scalar_dense(const at::Tensor& self) {
  synchronize(self.device().index(), "item");
  return alias_of(self).item();
}

std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p,
                                                  std::optional<bool> train) {
  if (input.numel() == 0) return {input, at::empty_like(input)};
  if (train.has_value() && !*train) {
    return {input.clone(), at::ones_like(input, input.options().dtype(c10::kBool))};
  }
  // Same draws as CPU's kernel: a bernoulli_ mask from the device generator, then scale.
  const double keep = 1.0 - p;
  const double scale = keep == 0 ? 0.0 : 1.0 / keep;
  at::Tensor mask = at::empty_like(input, input.options().dtype(c10::kBool));
  mask.bernoulli_(keep);
  at::Tensor output = input.mul(mask).mul_(scale);
  return {output, mask};
}

void record_stream(at::Tensor&, c10::Stream) {}


// Views are pure metadata; the adaptive controller only needs to know one was taken.
at::Tensor as_strided(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride,
                      std::optional<int64_t> offset) {
  note_view(self);
  return at::native::as_strided_tensorimpl(self, size, stride, offset);
}
at::Tensor view(const at::Tensor& self, c10::IntArrayRef size) {
  note_view(self);
  return at::native::view(self, size);
}
at::Tensor reshape_alias(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride) {
  note_view(self);
  return at::native::_reshape_alias(self, size, stride);
}
at::Tensor unfold(const at::Tensor& self, int64_t dim, int64_t size, int64_t step) {
  note_view(self);
  return at::native::unfold(self, dim, size, step);
}
at::Tensor view_as_real(const at::Tensor& self) {
  note_view(self);
  return at::native::view_as_real(self);
}
at::Tensor view_as_complex(const at::Tensor& self) {
  note_view(self);
  return at::native::view_as_complex(self);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", TORCH_FN(empty_memory_format));
  m.impl("empty_strided", TORCH_FN(empty_strided));
  m.impl("as_strided", TORCH_FN(as_strided));
  m.impl("view", TORCH_FN(view));
  m.impl("_reshape_alias", TORCH_FN(reshape_alias));
  m.impl("unfold", TORCH_FN(unfold));
  m.impl("view_as_real", TORCH_FN(view_as_real));
  m.impl("view_as_complex", TORCH_FN(view_as_complex));
  m.impl("resize_", TORCH_FN(resize_));
  m.impl("set_.source_Storage", TORCH_FN(set_storage));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(set_storage_offset));
  m.impl("set_.source_Tensor", TORCH_FN(set_tensor));
  m.impl("set_", TORCH_FN(set_empty));
  m.impl("_copy_from", TORCH_FN(copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
  m.impl("_local_scalar_dense", TORCH_FN(local_scalar_dense));
  m.impl("native_dropout", TORCH_FN(native_dropout));
  m.impl("record_stream", TORCH_FN(record_stream));
}

// Lazy conj/neg views reach our copy with their bits set: the aliases keep the bits and
// the CPU copy resolves them (the math fallback would recurse through clone -> copy_).
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}
TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&neuron_fallback>());
}

}  // namespace neuron::engine
