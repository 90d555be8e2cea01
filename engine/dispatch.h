// Entry points of op interception.
#pragma once

#include "engine/op_table.h"
#include "engine/pch.h"

namespace neuron::engine {

// Tensor arguments an unboxed entry point (fast_ops.cpp) pushed as borrowed IValues: the
// last `count` entries of the stack. They must never be destroyed as counted references.
struct BorrowedArgs {
  torch::jit::Stack* stack;
  size_t count;
  bool borrowed = true;
  // Turns them into counted references, before the stack goes to code that pops them.
  void make_owned();
  // Drops the borrowed tensors without touching their counts (they stay on the stack).
  void forget();
  // forget(), then removes the arguments from the stack.
  void drop();
};

// The boxed fallback for every op without a native neuron kernel.
void neuron_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);
// The same for an unboxed entry point whose tensor arguments are borrowed.
void neuron_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack, BorrowedArgs* borrowed);
// Syncs, runs the op on CPU aliases of device memory now, and puts neuron results on the
// stack. For data-dependent shapes, ops without Meta kernels and host-valued returns.
void run_synchronously(const c10::OperatorHandle& op, const OpInfo& info,
                       torch::jit::Stack* stack);

}  // namespace neuron::engine
