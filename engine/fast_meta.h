// Output geometry in C++ for common ops. torch registers Python meta kernels over the
// C++ structured ones at import (for symbolic shapes); a Python meta run costs 15-800 us,
// so every novel shape paid that per op. For the ops listed here, shape inference calls
// ATen's structured meta functions (at::meta::*: the same meta code the CPU kernel runs)
// or a rule written here, and falls back to the dispatcher's Meta kernel otherwise.
#pragma once

#include <string>
#include <vector>

#include "engine/pch.h"

namespace neuron::engine {

struct FastMeta;

// The fast path for an op ("aten::mul.Tensor"), or nullptr.
const FastMeta* find_fast_meta(const std::string& name);
// Runs it on a stack of meta arguments, leaving the returns; false (stack untouched)
// where this case is left to the dispatcher's Meta kernel.
bool run_fast_meta(const FastMeta& fast, const c10::OperatorHandle& op, torch::jit::Stack& stack);
// Ops with a fast path, and table entries whose C++ signature does not match the
// registered schema (skipped; a test asserts there are none).
std::vector<std::string> fast_meta_ops();
std::vector<std::string> fast_meta_mismatches();

}  // namespace neuron::engine
