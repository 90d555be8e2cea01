#include "engine/argument_recorder.h"

#include <memory>
#include <vector>

#include "backend/runtime.h"
#include "engine/engine.h"

namespace neuron::engine {
namespace {

using backend::ArgSlot;
using backend::SlotKind;
using trace::TensorMeta;

bool is_neuron(const at::Tensor& t) {
  return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1;
}

// Values with tensors inside that the recorder does not take apart (tuples, generic
// lists) cannot be queued: the op runs synchronously instead.
bool all_numbers(const c10::IValue& v) {
  for (const c10::IValue& e : v.toListRef())
    if (!e.isInt() && !e.isDouble()) return false;
  return true;
}

bool contains_tensor(const c10::IValue& v) {
  if (v.isTensor() || v.isTensorList()) return true;
  if (v.isList()) {
    for (const c10::IValue& e : v.toListRef())
      if (contains_tensor(e)) return true;
  }
  if (v.isTuple()) {
    for (const c10::IValue& e : v.toTupleRef().elements())
      if (contains_tensor(e)) return true;
  }
  return false;
}

}  // namespace

bool ArgumentRecorder::record(c10::ArrayRef<c10::IValue> args) {
  work_.record.reset(info_.id);
  for (size_t i = 0; i < args.size(); ++i) {
    if (!add(args[i], info_.arg_is_opt_list[i], info_.arg_is_liftable[i])) return false;
    // Scalar and float values never decide shapes: a fused program takes them as inputs.
    if (info_.arg_is_liftable[i] && (args[i].isDouble() || args[i].isInt()))
      work_.record.lift_last();
  }
  return true;
}

bool ArgumentRecorder::add_tensor(const at::Tensor& t) {
  TensorMeta meta;
  if (!backend::describe_tensor(t, meta)) return false;
  backend::TensorSource source;
  if (is_neuron(t)) {
    if (device_ < 0) device_ = t.device().index();
    TORCH_CHECK(device_ == t.device().index(), "Expected all tensors to be on the same device, "
                "but found neuron:", int(device_), " and neuron:", int(t.device().index()),
                " in ", info_.name);
    source.storage = backend::buffer_of(t.storage());
  } else if (t.defined()) {
    // Host tensors are snapshotted: the user may write them before the worker runs.
    source.host = t.clone(at::MemoryFormat::Preserve);
    // Python scalars arrive as wrapped numbers, which type promotion ignores.
    if (t.unsafeGetTensorImpl()->is_wrapped_number())
      source.host.unsafeGetTensorImpl()->set_wrapped_number(true);
  }
  if (t.defined())
    work_.record.add_tensor(meta);
  else
    work_.record.add_undefined_tensor();
  work_.inputs.push_back(std::move(source));
  return true;
}

bool ArgumentRecorder::add(const c10::IValue& v, bool optional_list, bool liftable_list) {
  auto& r = work_.record;
  ArgSlot slot;
  c10::IValue value;  // None for tensor slots
  if (v.isTensor()) {
    slot = {SlotKind::kTensor, static_cast<uint32_t>(r.tensors.size()), 1};
    if (!add_tensor(v.toTensor())) return false;
  } else if (v.isTensorList()) {
    auto list = v.toTensorList();
    slot = {SlotKind::kTensorList, static_cast<uint32_t>(r.tensors.size()),
            static_cast<uint32_t>(list.size())};
    r.begin_list(list.size());
    for (const at::Tensor& t : list)
      if (!add_tensor(t)) return false;
    r.end_list();
  } else if (optional_list && v.isList()) {
    auto list = v.toList();
    slot = {SlotKind::kOptionalTensorList, static_cast<uint32_t>(r.tensors.size()),
            static_cast<uint32_t>(list.size())};
    r.begin_list(list.size());
    for (const c10::IValue& e : list) {
      if (e.isTensor()) {
        if (!add_tensor(e.toTensor())) return false;
      } else {
        if (!add_tensor(at::Tensor())) return false;
      }
    }
    r.end_list();
  } else {
    if (contains_tensor(v)) return false;
    value = v;
    if (v.isNone()) {
      r.add_none();
    } else if (v.isInt()) {
      r.add_int(v.toInt());
    } else if (v.isDouble()) {
      r.add_double(v.toDouble());
    } else if (v.isBool()) {
      r.add_bool(v.toBool());
    } else if (v.isComplexDouble()) {
      auto c = v.toComplexDouble();
      r.add_complex(c.real(), c.imag());
    } else if (v.isIntList()) {
      auto list = v.toIntVector();
      r.add_int_list(list.data(), list.size());
    } else if (v.isDoubleList()) {
      auto list = v.toDoubleVector();
      r.add_double_list(list.data(), list.size());
    } else if (v.isBoolList()) {
      auto list = v.toBoolList();
      std::vector<bool> values(list.begin(), list.end());
      std::unique_ptr<bool[]> flat(new bool[values.size()]);
      for (size_t k = 0; k < values.size(); ++k) flat[k] = values[k];
      r.add_bool_list(flat.get(), values.size());
    } else if (v.isList() && all_numbers(v)) {
      // Scalar[] (foreach ops' per-tensor scalars): values, lifted like single scalars.
      std::vector<double> values;
      for (const c10::IValue& e : v.toListRef()) values.push_back(e.isInt() ? static_cast<double>(e.toInt()) : e.toDouble());
      r.add_double_list(values.data(), values.size());
      if (liftable_list)
        for (size_t k = values.size(); k > 0; --k)  // ascending, as the hash reads them
          r.lifted.push_back(static_cast<uint32_t>(r.signature.size() - k));
    } else if (v.isString()) {
      r.add_string(v.toStringRef());
    } else if (v.isDevice()) {
      auto d = v.toDevice();
      r.add_device(static_cast<int64_t>(d.type()), d.index());
      if (d.type() == c10::DeviceType::PrivateUse1) {
        if (device_ < 0) device_ = d.has_index() ? d.index() : current_device();
        value = c10::IValue(c10::Device(c10::kCPU));
      }
    } else if (v.isGenerator()) {
      // The CPU generator behind the neuron generator draws the numbers on the worker.
      r.add_scalar_type(-2);
      pending_generator_ = static_cast<int>(work_.values.size());
    } else {
      return false;  // symbolic values, tuples, lists of tensors in other shapes, objects
    }
  }
  work_.values.push_back(std::move(value));
  work_.slots.push_back(slot);
  return true;
}

}  // namespace neuron::engine
