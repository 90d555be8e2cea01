// Entry points of op interception.
#pragma once

#include "engine/op_table.h"
#include "engine/pch.h"

namespace neuron::engine {

// The boxed fallback for every op without a native neuron kernel.
void neuron_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);
// Syncs, runs the op on CPU aliases of device memory now, and puts neuron results on the
// stack. For data-dependent shapes, ops without Meta kernels and host-valued returns.
void run_synchronously(const c10::OperatorHandle& op, const OpInfo& info,
                       torch::jit::Stack* stack);

}  // namespace neuron::engine
