// Takes a boxed call's arguments apart into the op's work: its record (signature words
// and tensor metas), values, slots and tensor sources.
#pragma once

#include "backend/op_work.h"
#include "engine/op_table.h"
#include "engine/pch.h"

namespace neuron::engine {

class ArgumentRecorder {
 public:
  ArgumentRecorder(const OpInfo& info, backend::OpWork& work) : info_(info), work_(work) {}

  // Fills work.record/values/slots/inputs from the arguments. Returns false when an
  // argument cannot be queued (the caller then runs the op synchronously).
  bool record(c10::ArrayRef<c10::IValue> args);

  c10::DeviceIndex device() const { return device_; }

 private:
  bool add_tensor(const at::Tensor& t);
  bool add(const c10::IValue& v, bool optional_list, bool liftable_list);

 public:
  int pending_generator_ = -1;  // the generator argument's index (its value is set later), or -1

 private:
  const OpInfo& info_;
  backend::OpWork& work_;
  c10::DeviceIndex device_ = -1;
};

}  // namespace neuron::engine
