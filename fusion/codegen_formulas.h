// The per-op formulas of tier-2 kernels, shared by the pointwise generator (codegen.cpp)
// and the row generator (codegen_rows.cpp). Internal to fusion/.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "fusion/codegen.h"

namespace neuron::fusion::detail {

// Per op: the expression ATen's CPU kernel evaluates, for a whole vector (at::vec) and for
// one tail element; $0..$3 are the schema arguments (see codegen.cpp).
struct Formula {
  const char* vec;
  const char* scalar;
  int arity;
  bool float32 = true;  // false: ATen's float32 kernel is not this formula (double only)
  // ATen runs the op through MKL's vector math (at::vml, high-accuracy mode): the kernel
  // calls the same MKL function (libtorch_cpu exports it) on blocks of elements.
  const char* vml = nullptr;
};

// The op's formula, or null.
const Formula* find_formula(const std::string& name);
// The formula a kernel op gets under the spec's element type and numerics (gelu's
// `approximate` argument picks a variant; fast numerics allow formulas ATen does not
// evaluate this way), or null with why_not set.
const Formula* formula_for(const KernelOp& op, const KernelSpec& spec, std::string& why_not);
// `text` with $k replaced by "(args[k])".
std::string substitute(const char* text, const std::vector<std::string>& args);
// The code every kernel starts with: the element type T, Vec, and keep() (no contraction
// across ops); `type` is "float" or "double".
// Fast-numerics kernels say so in their first line: their keys (and verified marks in
// the disk cache) never meet an exact kernel's.
std::string kernel_prelude(const std::vector<std::string>& headers, const char* type, bool fast);

// The row reductions row kernels carry (codegen_row_math.cpp): row_moments and row_sum,
// with @r and @p standing for the 32-byte vector type's and intrinsics' suffixes.
const char* row_math_source();
// Declarations of the MKL vector-math functions the formulas `fs` call (nulls skipped).
std::string vml_declarations(const std::vector<const Formula*>& fs, ElemType type);
// A row kernel's source (spec.row > 0; codegen_rows.cpp).
std::optional<std::string> generate_row_kernel_source(const KernelSpec& spec, std::string& why_not);

}  // namespace neuron::fusion::detail
