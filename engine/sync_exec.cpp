// Ops that cannot be queued run here, at once, after the device drained: CPU kernels on
// aliases of device memory, results copied onto the device.
#include <ATen/MemoryOverlap.h>
#include <ATen/ops/empty.h>

#include "backend/op_work.h"
#include "engine/counters.h"
#include "engine/dispatch.h"
#include "engine/engine.h"
#include "engine/pch.h"
#include "engine/recording.h"
#include "engine/tensor_factory.h"

namespace neuron::engine {
namespace {

bool is_neuron(const at::Tensor& t) {
  return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1;
}

at::Tensor alias_of(const at::Tensor& t) {
  if (!is_neuron(t)) return t;
  trace::TensorMeta m;
  TORCH_CHECK(backend::describe_tensor(t, m), "neuron: tensors with more than ",
              trace::kMaxDims, " dimensions are not supported");
  return backend::cpu_alias(t.storage(), m);
}

// A fresh neuron tensor holding a copy of the CPU result, with its strides (LAPACK
// results can be views into a larger column-major buffer; the copy keeps that layout).
at::Tensor to_device(const at::Tensor& result, c10::DeviceIndex device) {
  if (!result.defined()) return result;
  const bool keep = result.is_non_overlapping_and_dense() ||
                    at::has_internal_overlap(result) == at::MemOverlap::No;
  at::Tensor src = keep ? result : result.contiguous();
  trace::TensorMeta m;
  TORCH_CHECK(backend::describe_tensor(src, m), "neuron: too many dimensions");
  m.storage_offset = 0;
  at::Tensor out = empty_like_meta(m, device);
  backend::cpu_alias(out.storage(), m).copy_(src);
  return out;
}

// Gives the neuron out tensor the result's geometry and data.
void write_back(const at::Tensor& out, const at::Tensor& result) {
  trace::TensorMeta m;
  at::Tensor src = result.contiguous();
  TORCH_CHECK(backend::describe_tensor(src, m), "neuron: too many dimensions");
  m.storage_offset = out.storage_offset();
  if (!out.sizes().equals(src.sizes())) set_geometry(out, m);
  alias_of(out).copy_(src);
}

}  // namespace

void run_synchronously(const c10::OperatorHandle& op, const OpInfo& info,
                       torch::jit::Stack* stack) {
  bump(g_counters.ops_synchronous);
  const auto& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  auto args = torch::jit::last(*stack, num_args);

  c10::DeviceIndex device = -1;
  auto note = [&](const at::Tensor& t) {
    if (is_neuron(t) && device < 0) device = t.device().index();
  };
  for (const c10::IValue& v : args) {
    if (v.isTensor()) note(v.toTensor());
    if (v.isTensorList())
      for (const at::Tensor& t : v.toTensorList()) note(t);
    if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1 && device < 0)
      device = v.toDevice().has_index() ? v.toDevice().index() : current_device();
  }
  if (device < 0) device = current_device();
  synchronize_all("op with a host-dependent result");
  note_synchronous_op(info);

  // Out= arguments get fresh CPU tensors (the kernel may resize them); everything else
  // is an alias, so in-place writes land in device memory directly.
  torch::jit::Stack cpu;
  std::vector<std::pair<size_t, c10::IValue>> outs;  // arg index -> CPU out
  for (size_t i = 0; i < num_args; ++i) {
    const c10::IValue& v = args[i];
    const auto& type = schema.arguments()[i].type();
    if (info.arg_is_out[i] && v.isTensor() && is_neuron(v.toTensor())) {
      c10::IValue fresh(at::empty({0}, v.toTensor().options().device(c10::kCPU)));
      outs.emplace_back(i, fresh);
      cpu.push_back(fresh);
    } else if (info.arg_is_out[i] && v.isTensorList()) {
      std::vector<at::Tensor> list;
      for (const at::Tensor& t : v.toTensorList())
        list.push_back(at::empty({0}, t.options().device(c10::kCPU)));
      c10::IValue fresh(list);
      outs.emplace_back(i, fresh);
      cpu.push_back(fresh);
    } else if (v.isTensor()) {
      cpu.emplace_back(alias_of(v.toTensor()));
    } else if (v.isTensorList()) {
      std::vector<at::Tensor> list;
      for (const at::Tensor& t : v.toTensorList()) list.push_back(alias_of(t));
      cpu.emplace_back(list);
    } else if (info.arg_is_opt_list[i] && v.isList()) {
      c10::List<std::optional<at::Tensor>> list;
      for (const c10::IValue& e : v.toList())
        list.push_back(e.isTensor() ? std::optional<at::Tensor>(alias_of(e.toTensor()))
                                    : std::nullopt);
      cpu.emplace_back(list);
    } else if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1) {
      cpu.emplace_back(c10::Device(c10::kCPU));
    } else if (v.isGenerator() && v.toGenerator().device().type() == c10::DeviceType::PrivateUse1) {
      cpu.emplace_back(host_generator_of(v.toGenerator()));
    } else if (v.isNone() && type->kind() == c10::TypeKind::OptionalType &&
               type->castRaw<c10::OptionalType>()->getElementType()->kind() ==
                   c10::TypeKind::GeneratorType) {
      cpu.emplace_back(host_generator_of(default_generator(device)));
    } else {
      cpu.push_back(v);
    }
  }
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &cpu);
  }

  for (auto& [index, fresh] : outs) {
    const c10::IValue& original = args[index];
    if (original.isTensor()) {
      write_back(original.toTensor(), fresh.toTensor());
    } else {
      auto dst = original.toTensorList();
      auto src = fresh.toTensorList();
      for (size_t k = 0; k < dst.size(); ++k) write_back(dst.get(k), src.get(k));
    }
  }

  torch::jit::Stack results;
  for (size_t r = 0; r < info.returns.size(); ++r) {
    const ReturnInfo& ri = info.returns[r];
    c10::IValue& v = cpu[r];
    if (ri.kind == ReturnInfo::kInplace) {
      results.push_back(args[static_cast<size_t>(ri.alias_arg)]);
    } else if (ri.kind == ReturnInfo::kNonTensor) {
      results.push_back(std::move(v));
    } else if (ri.kind == ReturnInfo::kView) {
      const c10::IValue& base = args[static_cast<size_t>(ri.alias_arg)];
      auto view = [&](const at::Tensor& b, const at::Tensor& cpu_view) {
        if (!is_neuron(b)) return cpu_view;
        trace::TensorMeta m;
        TORCH_CHECK(backend::describe_tensor(cpu_view, m), "neuron: too many dimensions");
        return view_of(b, m);
      };
      if (ri.is_list) {
        std::vector<at::Tensor> list;
        auto src = v.toTensorList();
        for (size_t k = 0; k < src.size(); ++k)
          list.push_back(view(base.isTensor() ? base.toTensor() : base.toTensorList().get(k),
                              src.get(k)));
        results.emplace_back(list);
      } else {
        results.emplace_back(view(base.toTensor(), v.toTensor()));
      }
    } else if (ri.is_list) {
      std::vector<at::Tensor> list;
      for (const at::Tensor& t : v.toTensorList()) list.push_back(to_device(t, device));
      results.emplace_back(list);
    } else {
      results.emplace_back(to_device(v.isTensor() ? v.toTensor() : at::Tensor(), device));
    }
  }
  torch::jit::drop(*stack, num_args);
  for (auto& r : results) stack->push_back(std::move(r));
}

}  // namespace neuron::engine
