// Output geometry of a queued op: the Meta kernel run on tensors shaped like the
// recorded inputs, corrected where CPU kernels lay out or size outputs differently.
#pragma once

#include <vector>

#include "backend/op_work.h"
#include "engine/op_table.h"
#include "engine/pch.h"

namespace neuron::engine {

// Output geometry goes to outs: first each written argument (after the op), then each
// return (a list return: a count entry, then its elements).
void infer_with_meta(const c10::OperatorHandle& op, const OpInfo& info,
                     const backend::OpWork& work, c10::ArrayRef<c10::IValue> args,
                     std::vector<trace::TensorMeta>& outs);
void match_cpu_shapes(const OpInfo& info, c10::ArrayRef<c10::IValue> args,
                      std::vector<trace::TensorMeta>& outs, const backend::OpWork& work);

}  // namespace neuron::engine
