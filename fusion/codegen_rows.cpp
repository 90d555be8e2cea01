// Tier 2 for row groups: one pass over each row of a group whose tiles are whole rows.
// Pointwise ops run in registers as in pointwise kernels (codegen.cpp); row ops (softmax,
// log_softmax, layer norm) run on the whole row between two register stages, in the
// order ATen's own row kernels use, so the bits match per-op eager; a value that crosses
// a row op lives in a row-sized buffer (or straight in its output). Operands may be
// broadcast down the rows (a norm's weight) or along them (one value per row).
#include <algorithm>
#include <array>
#include <sstream>

#include "fusion/codegen.h"
#include "fusion/codegen_formulas.h"

namespace neuron::fusion {
namespace {

enum class RowOp : uint8_t { kNone, kSoftmax, kLogSoftmax, kLayerNorm, kSum, kMean };

RowOp row_op_of(const std::string& name) {
  if (name == "aten::_softmax") return RowOp::kSoftmax;
  if (name == "aten::_log_softmax") return RowOp::kLogSoftmax;
  if (name == "aten::native_layer_norm") return RowOp::kLayerNorm;
  if (name == "aten::sum.dim_IntList") return RowOp::kSum;
  if (name == "aten::mean.dim") return RowOp::kMean;
  return RowOp::kNone;
}

}  // namespace

bool native_row_op_supported(const std::string& name) { return row_op_of(name) != RowOp::kNone; }

namespace detail {

std::optional<std::string> generate_row_kernel_source(const KernelSpec& spec, std::string& why_not) {
  const char* type = spec.type == ElemType::kFloat32 ? "float" : "double";
  const int64_t R = spec.row;
  // Whole vectors only: every op's vector tails then fall where ATen's do (at row ends,
  // which are the tensor's or, broadcast, the inner loop's).
  if (R % 64 != 0) return why_not = "rows of " + std::to_string(R) + " elements (tier 2 needs a multiple of 64)", std::nullopt;
  const size_t n_ops = spec.ops.size(), n_ptrs = static_cast<size_t>(spec.pointers);
  std::vector<const Formula*> fs(n_ops, nullptr);
  std::vector<RowOp> rs(n_ops, RowOp::kNone);
  std::vector<int> pos(n_ops);
  std::vector<std::vector<std::string>> vargs(n_ops), sargs(n_ops);
  std::vector<std::vector<int>> value_args(n_ops), input_args(n_ops);
  std::vector<bool> row_input(n_ptrs, false), scalar_input(n_ptrs, false), scalar_used(static_cast<size_t>(spec.scalars), false);
  // Outputs that are one value per row (st<k>_<o> in the kernel): a layer norm's mean and
  // rstd, a row sum or mean, a per-row op's result.
  std::vector<std::array<bool, 3>> row_value(n_ops, {false, false, false});
  bool any_per_row = false;
  auto block_op = [&](size_t k) { return rs[k] != RowOp::kNone || (fs[k] && fs[k]->vml) || spec.ops[k].per_row; };
  // Block ops whose result is a row (kept in a row buffer or its output).
  auto row_result = [&](size_t k) {
    return rs[k] == RowOp::kSoftmax || rs[k] == RowOp::kLogSoftmax || rs[k] == RowOp::kLayerNorm ||
           (fs[k] && fs[k]->vml && !spec.ops[k].per_row);
  };
  int stages = 1;
  for (size_t k = 0; k < n_ops; ++k) {
    const KernelOp& op = spec.ops[k];
    rs[k] = row_op_of(op.name);
    int arity = 0;
    if (rs[k] == RowOp::kNone) {
      fs[k] = formula_for(op, spec, why_not);
      if (fs[k] == nullptr) return std::nullopt;
      arity = fs[k]->arity;
      if (op.per_row) {
        if (fs[k]->vml) return why_not = op.name + " over one value per row has no native formula", std::nullopt;
        if (spec.rows <= 0) return why_not = "per-row ops need the tensor's row count", std::nullopt;
        row_value[k][0] = any_per_row = true;
      }
    } else {
      arity = rs[k] == RowOp::kLayerNorm ? 5 : 1;
      row_value[k] = {rs[k] == RowOp::kSum || rs[k] == RowOp::kMean, rs[k] == RowOp::kLayerNorm, rs[k] == RowOp::kLayerNorm};
      if ((rs[k] == RowOp::kSoftmax || rs[k] == RowOp::kLogSoftmax) && op.args.size() > 2 && op.args[2].text == "true")
        return why_not = op.name + " with half_to_float has no native formula", std::nullopt;
    }
    if (static_cast<int>(op.args.size()) < arity)
      return why_not = op.name + ": expected " + std::to_string(arity) + " arguments", std::nullopt;
    if (block_op(k)) {
      pos[k] = 2 * (stages - 1) + 1;
      ++stages;
    } else {
      pos[k] = 2 * (stages - 1);
    }
    vargs[k].assign(static_cast<size_t>(arity), "");
    sargs[k].assign(static_cast<size_t>(arity), "");
    for (int a = 0; a < arity; ++a) {
      const KernelArg& arg = op.args[static_cast<size_t>(a)];
      const auto i = static_cast<size_t>(arg.index);
      const std::string n = std::to_string(arg.index);
      const bool ptr = arg.kind == KernelArg::kInput || arg.kind == KernelArg::kColumnInput ||
                       arg.kind == KernelArg::kRowInput || arg.kind == KernelArg::kScalarInput;
      if (ptr && (arg.index < 0 || i >= n_ptrs)) return why_not = "pointer index out of range", std::nullopt;
      switch (arg.kind) {
        case KernelArg::kValue:
          if (arg.index < 0 || i >= k) return why_not = op.name + ": reads a value not computed yet", std::nullopt;
          if (arg.output < 0 || arg.output > 2) return why_not = op.name + ": reads an unknown output", std::nullopt;
          if (!row_value[i][static_cast<size_t>(arg.output)]) {
            if (arg.output != 0) return why_not = op.name + ": reads an output without per-row values", std::nullopt;
            vargs[k][a] = "r" + n;
            sargs[k][a] = "q" + n;
            value_args[k].push_back(arg.index);
          } else {
            const std::string st = "st" + n + "_" + std::to_string(arg.output);
            vargs[k][a] = "Vec(" + st + ")";
            sargs[k][a] = st;
          }
          break;
        case KernelArg::kInput:
          vargs[k][a] = "x" + n;
          input_args[k].push_back(arg.index);
          break;
        case KernelArg::kColumnInput:
          vargs[k][a] = "w" + n;
          input_args[k].push_back(arg.index);
          break;
        case KernelArg::kRowInput:
          row_input[i] = true;
          vargs[k][a] = "vr" + n;
          sargs[k][a] = "cr" + n;
          break;
        case KernelArg::kScalarInput:
          scalar_input[i] = true;
          vargs[k][a] = "vc" + n;
          sargs[k][a] = "c" + n;
          break;
        case KernelArg::kScalar:
          if (arg.index < 0 || i >= scalar_used.size()) return why_not = "scalar index out of range", std::nullopt;
          scalar_used[i] = true;
          vargs[k][a] = "vs" + n;
          sargs[k][a] = "s" + n;
          break;
        case KernelArg::kConst:
          if (rs[k] == RowOp::kNone) return why_not = op.name + ": argument " + std::to_string(a) + " must be a tensor or scalar", std::nullopt;
          vargs[k][a] = arg.text;
          break;
      }
    }
    // Row ops: the row operand is a full-size tensor; a layer norm's weight and bias are
    // columns (or absent) and its eps a scalar.
    if (op.per_row) {  // over per-row values only (ATen's loop over the [rows, 1] tensor)
      if (!value_args[k].empty() || !input_args[k].empty())
        return why_not = op.name + ": a per-row op reads a whole row", std::nullopt;
    } else if (block_op(k)) {
      const KernelArg& in = op.args[0];
      if (!(in.kind == KernelArg::kInput || (in.kind == KernelArg::kValue && in.output == 0 && !row_value[static_cast<size_t>(in.index)][0])))
        return why_not = op.name + ": its operand must be a full-size tensor", std::nullopt;
    }
    if (rs[k] == RowOp::kLayerNorm) {
      for (int a : {2, 3}) {
        const KernelArg& w = op.args[static_cast<size_t>(a)];
        if (!(w.kind == KernelArg::kColumnInput || (w.kind == KernelArg::kConst && w.text == "None")))
          return why_not = op.name + ": weight and bias must be one row of values", std::nullopt;
      }
      if (op.args[4].kind != KernelArg::kScalar) return why_not = op.name + ": eps must be a number", std::nullopt;
    }
    if (op.store >= spec.pointers) return why_not = "store index out of range", std::nullopt;
    for (int32_t s : op.row_stores)
      if (s >= spec.pointers) return why_not = "store index out of range", std::nullopt;
  }
  // Values kept in a row buffer (or their output): a block op's result, and any value read
  // at another position or by a block op. No pointer is loaded after an earlier position
  // stored to it (the load would see the new value).
  std::vector<bool> buffered(n_ops, false);
  std::vector<int> first_store(n_ptrs, 1 << 30);
  for (size_t k = 0; k < n_ops; ++k) {
    if (row_result(k)) buffered[k] = true;
    for (int v : value_args[k])
      if (pos[static_cast<size_t>(v)] != pos[k] || block_op(k)) buffered[static_cast<size_t>(v)] = true;
    for (int p : input_args[k])
      if (first_store[static_cast<size_t>(p)] < pos[k])
        return why_not = spec.ops[k].name + ": reads an operand that an earlier step overwrote", std::nullopt;
    auto note_store = [&](int32_t s) {
      if (s >= 0) first_store[static_cast<size_t>(s)] = std::min(first_store[static_cast<size_t>(s)], pos[k]);
    };
    note_store(spec.ops[k].store);
    for (int32_t s : spec.ops[k].row_stores) note_store(s);
  }
  size_t buffer_bytes = 0;
  for (size_t k = 0; k < n_ops; ++k)
    if (buffered[k] && spec.ops[k].store < 0) buffer_bytes += static_cast<size_t>(R) * (spec.type == ElemType::kFloat32 ? 4 : 8);
  if (buffer_bytes > (size_t{256} << 10))
    return why_not = "row buffers of " + std::to_string(buffer_bytes >> 10) + " KiB (at most 256 KiB on a worker's stack)", std::nullopt;

  auto operand = [&](const KernelArg& a) {  // a row op's row operand
    return a.kind == KernelArg::kInput ? "p" + std::to_string(a.index) + " + off" : "B" + std::to_string(a.index);
  };
  std::ostringstream src;
  // The moments' 32-byte vector type and intrinsics: @r and @p name them per element type.
  std::string moments = row_math_source();
  const bool f32 = spec.type == ElemType::kFloat32;
  for (size_t at = moments.find('@'); at != std::string::npos; at = moments.find('@', at))
    moments.replace(at, 2, moments[at + 1] == 'r' ? (f32 ? "" : "d") : (f32 ? "ps" : "pd"));
  src << kernel_prelude(spec.headers, type, spec.fast) << "#include <array>\n" << moments;
  src << vml_declarations(fs, spec.type);
  src << "extern \"C\" __attribute__((visibility(\"default\"))) void " << kNativeSymbol
      << "(int64_t begin, int64_t end, char* const* ptrs, const double* scalars) {\n"
         "  (void)scalars;\n  constexpr int64_t R = "
      << R << ";\n";
  // Per-row ops: ATen's loop over the [rows, 1] tensor takes two vectors per step and
  // leaves its last rows to the scalar formula.
  if (any_per_row)
    src << "  constexpr int64_t RV = (int64_t{" << spec.rows << "} / (2 * Vec::size())) * (2 * Vec::size());\n";
  for (int32_t i = 0; i < spec.scalars; ++i)
    if (scalar_used[static_cast<size_t>(i)])
      src << "  const T s" << i << " = static_cast<T>(scalars[" << i << "]);\n  const Vec vs" << i << "(s" << i << ");\n";
  for (size_t i = 0; i < n_ptrs; ++i) {
    src << "  T* const p" << i << " = reinterpret_cast<T*>(ptrs[" << i << "]);\n";
    if (scalar_input[i]) src << "  const T c" << i << " = *p" << i << ";\n  const Vec vc" << i << "(c" << i << ");\n";
  }
  for (size_t k = 0; k < n_ops; ++k)
    if (buffered[k] && spec.ops[k].store < 0) src << "  alignas(64) T b" << k << "[R];\n";
  src << "  for (int64_t r = begin / R; r < end / R; ++r) {\n    const int64_t off = r * R;\n";
  for (size_t i = 0; i < n_ptrs; ++i)
    if (row_input[i]) src << "    const T cr" << i << " = p" << i << "[r];\n    const Vec vr" << i << "(cr" << i << ");\n";
  for (size_t k = 0; k < n_ops; ++k) {
    if (buffered[k])
      src << "    T* const B" << k << " = " << (spec.ops[k].store >= 0 ? "p" + std::to_string(spec.ops[k].store) + " + off" : "b" + std::to_string(k)) << ";\n";
    for (size_t o = 0; o < 3; ++o)
      if (row_value[k][o]) src << "    T st" << k << "_" << o << " = 0;\n";
  }
  for (int at = 0; at < 2 * stages - 1; ++at) {
    if (at % 2 == 0) {  // a register stage over the row, whole vectors
      std::ostringstream body;
      std::vector<bool> loaded(n_ptrs, false), value_loaded(n_ops, false);
      bool any = false;
      for (size_t k = 0; k < n_ops; ++k) {
        if (pos[k] != at || block_op(k)) continue;
        any = true;
        const KernelOp& op = spec.ops[k];
        for (const KernelArg& a : op.args) {
          const auto i = static_cast<size_t>(a.index);
          if ((a.kind == KernelArg::kInput || a.kind == KernelArg::kColumnInput) && !loaded[i]) {
            loaded[i] = true;
            body << "      const Vec " << (a.kind == KernelArg::kInput ? "x" : "w") << i << " = Vec::loadu(p" << i
                 << (a.kind == KernelArg::kInput ? " + off" : "") << " + j);\n";
          }
          if (a.kind == KernelArg::kValue && a.output == 0 && !row_value[i][0] && pos[i] != at && !value_loaded[i]) {
            value_loaded[i] = true;
            body << "      const Vec r" << i << " = Vec::loadu(B" << i << " + j);\n";
          }
        }
        body << "      const Vec r" << k << " = keep(" << substitute(fs[k]->vec, vargs[k]) << ");\n";
        if (buffered[k]) body << "      r" << k << ".store(B" << k << " + j);\n";
        else if (op.store >= 0) body << "      r" << k << ".store(p" << op.store << " + off + j);\n";
      }
      if (any) src << "    for (int64_t j = 0; j < R; j += Vec::size()) {\n" << body.str() << "    }\n";
      continue;
    }
    for (size_t k = 0; k < n_ops; ++k) {
      if (pos[k] != at) continue;
      const KernelOp& op = spec.ops[k];
      const std::string st = "st" + std::to_string(k);
      if (op.per_row) {  // one value per row: the vector formula's first lane, or the scalar one
        src << "    if (r < RV) {\n      alignas(64) T lanes[Vec::size()];\n      keep(" << substitute(fs[k]->vec, vargs[k])
            << ").store(lanes);\n      " << st << "_0 = lanes[0];\n    } else {\n      " << st << "_0 = keep(static_cast<T>("
            << substitute(fs[k]->scalar, sargs[k]) << "));\n    }\n";
        if (op.store >= 0) src << "    p" << op.store << "[r] = " << st << "_0;\n";
        continue;
      }
      if (rs[k] == RowOp::kSum || rs[k] == RowOp::kMean) {  // ATen's mean: the sum, divided by the count
        src << "    " << st << "_0 = row_sum(" << operand(op.args[0]) << ", R)" << (rs[k] == RowOp::kMean ? " / static_cast<T>(R)" : "")
            << ";\n";
        if (op.store >= 0) src << "    p" << op.store << "[r] = " << st << "_0;\n";
        continue;
      }
      const std::string in = operand(op.args[0]), out = "B" + std::to_string(k);
      src << "    {\n      const T* in = " << in << ";\n      T* out = " << out << ";\n";
      switch (rs[k]) {
        case RowOp::kNone:  // MKL's vector math on the row
          src << "      vm" << (spec.type == ElemType::kFloat32 ? 's' : 'd') << fs[k]->vml << "(R, in, out, 0x2 | 0x140000 | 0x100);\n";
          break;
        case RowOp::kSoftmax:  // max, exp(x - max) and its sum, times 1 / sum
          src << "      const T mx = at::vec::reduce_all<T>([](Vec& a, Vec& b) { return at::vec::maximum(a, b); }, in, R);\n"
                 "      at::vec::map([mx](Vec v) { return (v - Vec(mx)).exp(); }, out, in, R);\n"
                 "      T sum = at::vec::reduce_all<T>([](Vec a, Vec b) { return a + b; }, out, R);\n"
                 "      sum = 1 / sum;\n"
                 "      at::vec::map([sum](Vec v) { return v * Vec(sum); }, out, out, R);\n";
          break;
        case RowOp::kLogSoftmax:  // max, log of the sum of exp(x - max), x - max - log
          src << "      const T mx = at::vec::reduce_all<T>([](Vec& a, Vec& b) { return at::vec::maximum(a, b); }, in, R);\n"
                 "      T lse = at::vec::map_reduce_all<T>([mx](Vec v) { return (v - Vec(mx)).exp(); }, [](Vec a, Vec b) { return a + b; }, in, R);\n"
                 "      at::vec::map([](Vec v) { return v.log(); }, &lse, &lse, 1);\n"
                 "      at::vec::map([mx, lse](Vec v) { return v - Vec(mx) - Vec(lse); }, out, in, R);\n";
          break;
        case RowOp::kSum:
        case RowOp::kMean:
          break;  // above
        case RowOp::kLayerNorm: {  // moments, rstd, then (x - mean) * rstd * weight + bias
          const KernelArg &w = op.args[2], &b = op.args[3];
          src << "      row_moments(in, R, " << st << "_1, " << st << "_2);\n      " << st << "_2 = T(1) / std::sqrt(" << st
              << "_2 + " << sargs[k][4] << ");\n      const T scale = " << st << "_2, shift = -" << st << "_1;\n";
          if (w.kind == KernelArg::kColumnInput && b.kind == KernelArg::kColumnInput)
            src << "      at::vec::map3<T>([scale, shift](Vec x, Vec g, Vec b) { return (x + Vec(shift)) * Vec(scale) * g + b; }, out, in, p"
                << w.index << ", p" << b.index << ", R);\n";
          else
            src << "      for (int64_t j = 0; j < R; ++j) {\n        const T g = " << (w.kind == KernelArg::kColumnInput ? "p" + std::to_string(w.index) + "[j]" : "T(1)")
                << ", b = " << (b.kind == KernelArg::kColumnInput ? "p" + std::to_string(b.index) + "[j]" : "T(0)")
                << ";\n        out[j] = (in[j] + shift) * scale * g + b;\n      }\n";
          for (size_t o = 0; o < op.row_stores.size() && o < 2; ++o)
            if (op.row_stores[o] >= 0) src << "      p" << op.row_stores[o] << "[r] = " << st << "_" << o + 1 << ";\n";
          break;
        }
      }
      src << "    }\n";
    }
  }
  src << "  }\n}\n";
  return src.str();
}

}  // namespace detail
}  // namespace neuron::fusion
