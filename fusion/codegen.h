// Tier 2: C++ source for a fused pointwise group. The kernel mirrors ATen's CPU kernels
// op by op (the same at::vec::Vectorized expressions for whole vectors, the same scalar
// expressions for the tail, the same loop shape), so its results match per-op eager;
// the engine still checks every new kernel against tier 1 before it is used.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace neuron::fusion {

enum class ElemType : uint8_t { kFloat32, kFloat64 };

// One argument of a kernel op, in the op's schema order.
struct KernelArg {
  enum Kind : uint8_t {
    kValue,        // the result of op `index` of this kernel (kept in registers)
    kInput,        // a full-size operand: ptrs[index], element i
    kScalarInput,  // a one-element operand (0-dim tensor): *ptrs[index]
    kScalar,       // a runtime scalar: scalars[index], converted to the element type
    kConst,        // a constant baked into the kernel (text, e.g. gelu's "tanh")
  } kind = kValue;
  int32_t index = 0;
  std::string text;
};

struct KernelOp {
  std::string name;               // aten::add.Tensor, ...
  std::vector<KernelArg> args;    // schema order
  int32_t store = -1;             // ptrs index the result is written to; -1: registers only
};

struct KernelSpec {
  ElemType type = ElemType::kFloat32;
  std::vector<KernelOp> ops;
  int32_t pointers = 0;  // ptrs[] entries (inputs and stored results)
  int32_t scalars = 0;   // scalars[] entries
  // Headers that define the vector library the formulas use (at::vec::Vectorized and
  // its functions), included first; the backend names them (this layer is torch-free).
  std::vector<std::string> headers;
};

// The entry point every generated kernel exports: elements [begin, end) of every
// full-size operand.
using NativeKernelFn = void (*)(int64_t begin, int64_t end, char* const* ptrs,
                                const double* scalars);
inline constexpr const char* kNativeSymbol = "neuron_fused_kernel";

// Whether an op (schema name) has a tier-2 formula for that element type.
bool native_op_supported(const std::string& name, ElemType type);

// The kernel's source, or std::nullopt with why_not set (an op without a formula, an
// argument of the wrong kind).
std::optional<std::string> generate_kernel_source(const KernelSpec& spec, std::string& why_not);

}  // namespace neuron::fusion
