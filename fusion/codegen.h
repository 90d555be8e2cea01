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
    // Row kernels (KernelSpec::row > 0) only:
    kColumnInput,  // one row's worth of values, the same for every row: ptrs[index][j]
    kRowInput,     // one value per row: ptrs[index][r]
  } kind = kValue;
  int32_t index = 0;
  int32_t output = 0;  // kValue: which output of op `index` (a layer norm's mean is 1, rstd 2)
  std::string text;
};

struct KernelOp {
  std::string name;               // aten::add.Tensor, ...
  std::vector<KernelArg> args;    // schema order
  int32_t store = -1;             // ptrs index the result is written to; -1: registers only
  // Row ops' per-row outputs 1, 2, ... (a layer norm's mean and rstd): the ptrs index each
  // is written to (one value per row), -1: not written.
  std::vector<int32_t> row_stores;
  // Row kernels: a pointwise op over one value per row (its result is one value per row,
  // as a row sum's); its store then writes one value per row.
  bool per_row = false;
};

struct KernelSpec {
  ElemType type = ElemType::kFloat32;
  std::vector<KernelOp> ops;
  int32_t pointers = 0;  // ptrs[] entries (inputs and stored results)
  int32_t scalars = 0;   // scalars[] entries
  // Row kernels: elements per row (the last dim), a multiple of 64; the kernel runs whole
  // rows, and may hold row ops (softmax, log_softmax, layer norm) besides pointwise ones,
  // whose operands may be broadcast along rows or columns. 0: a pointwise kernel.
  int64_t row = 0;
  // Fast numerics (the policy's numerics = fast): formulas that are not ATen's are allowed
  // (float32 gelu and its backward, gelu with approximate='tanh'), within documented bounds.
  bool fast = false;
  int64_t rows = 0;  // row kernels with per-row ops: the tensor's rows (ATen's loop over
                     // them puts its scalar tail at the last rows)
  // Headers that define the vector library the formulas use (at::vec::Vectorized and
  // its functions), included first; the backend names them (this layer is torch-free).
  std::vector<std::string> headers;
};

// The entry point every generated kernel exports: elements [begin, end) of every
// full-size operand (row kernels: whole rows, begin and end multiples of the row).
using NativeKernelFn = void (*)(int64_t begin, int64_t end, char* const* ptrs,
                                const double* scalars);
inline constexpr const char* kNativeSymbol = "neuron_fused_kernel";

// Whether an op (schema name) has a tier-2 formula for that element type (row ops only in
// row kernels: native_row_op_supported).
bool native_op_supported(const std::string& name, ElemType type, bool fast = false);
bool native_row_op_supported(const std::string& name);

// The kernel's source, or std::nullopt with why_not set (an op without a formula, an
// argument of the wrong kind).
std::optional<std::string> generate_kernel_source(const KernelSpec& spec, std::string& why_not);

}  // namespace neuron::fusion
