#include "fusion/codegen.h"
#include "fusion/codegen_formulas.h"

#include <algorithm>
#include <sstream>
#include <unordered_map>

namespace neuron::fusion {
namespace detail {

// Per op: the expression ATen's CPU kernel evaluates, for a whole vector (at::vec) and for
// one tail element. $0..$3 are the schema arguments. Each mirrors the kernel's own text
// (operation order matters for bits): BinaryOpsKernel, UnaryOpsKernel, Activation,
// GeluKernel, PointwiseOpsKernel and the ufunc add in ATen. Only ops checked bit for bit
// against ATen (tests/python/test_native.py) are listed. sqrt, exp, log, tanh and erf go
// through MKL's vector math in ATen and so they do here; float32 gelu goes through oneDNN:
// it is left to tier 1 (fast numerics take our formula for it).
namespace {
const std::unordered_map<std::string, Formula>& formulas() {
  static const std::unordered_map<std::string, Formula> f = {
      {"aten::add.Tensor", {"at::vec::fmadd($1, $2, $0)", "$0 + $2 * $1", 3}},
      {"aten::add.Scalar", {"at::vec::fmadd($1, $2, $0)", "$0 + $2 * $1", 3}},
      {"aten::sub.Tensor", {"at::vec::fmadd($1, $2.neg(), $0)", "$0 + (-$2) * $1", 3}},
      {"aten::rsub.Tensor", {"at::vec::fmadd($0, $2.neg(), $1)", "$1 + (-$2) * $0", 3}},
      {"aten::mul.Tensor", {"$0 * $1", "$0 * $1", 2}},
      // pow(self, 2): ATen's pow kernel squares for an exponent of 2 (the only one bound:
      // the backend passes other exponents to tier 1).
      {"aten::pow.Tensor_Scalar", {"$0 * $0", "$0 * $0", 1}},
      {"aten::mul.Scalar", {"$0 * $1", "$0 * $1", 2}},
      {"aten::div.Tensor", {"$0 / $1", "$0 / $1", 2}},
      {"aten::neg", {"$0.neg()", "-$0", 1}},
      {"aten::abs", {"$0.abs()", "std::abs($0)", 1}},
      {"aten::expm1", {"$0.expm1()", "std::expm1($0)", 1}},
      {"aten::log1p", {"$0.log1p()", "std::log1p($0)", 1}},
      {"aten::rsqrt", {"$0.rsqrt()", "T(1) / std::sqrt($0)", 1}},
      {"aten::reciprocal", {"$0.reciprocal()", "T(1) / $0", 1}},
      {"aten::sigmoid",
       {"(((Vec(T(0)) - $0).exp()) + Vec(T(1))).reciprocal()", "T(1) / (T(1) + std::exp(-$0))", 1}},
      {"aten::silu", {"$0 / (Vec(T(1)) + $0.neg().exp())", "$0 / (T(1) + std::exp(-$0))", 1}},
      // gelu(self, approximate="none"): x * 0.5 * (1 + erf(x / sqrt(2)))
      {"aten::gelu",
       {"$0 * Vec(T(0.5)) * (Vec(T(1)) + ($0 * Vec(T(M_SQRT1_2))).erf())",
        "$0 * 0.5 * (1 + std::erf($0 * T(M_SQRT1_2)))", 1, false}},
      {"aten::gelu_backward",
       {"$0 * ((Vec(T(0.5)) * (Vec(T(1)) + ($1 * Vec(T(M_SQRT1_2))).erf())) + $1 * "
        "(Vec(T(M_2_SQRTPI * M_SQRT1_2 * 0.5)) * ($1 * $1 * Vec(T(-0.5))).exp()))",
        "$0 * ((0.5 * (1 + std::erf($1 * T(M_SQRT1_2)))) + $1 * (T(M_2_SQRTPI * M_SQRT1_2 * "
        "0.5) * std::exp($1 * $1 * -0.5)))",
        2, false}},
      {"aten::silu_backward",
       {"$0 * (Vec(T(1)) / (Vec(T(1)) + $1.neg().exp())) * (Vec(T(1)) + $1 * (Vec(T(1)) - "
        "(Vec(T(1)) / (Vec(T(1)) + $1.neg().exp()))))",
        "$0 * (T(1) / (T(1) + std::exp(-$1))) * (T(1) + $1 * (T(1) - (T(1) / (T(1) + "
        "std::exp(-$1)))))",
        2}},
      {"aten::tanh_backward", {"$0 * (Vec(T(1)) - $1 * $1)", "$0 * (T(1) - $1 * $1)", 2}},
      {"aten::sigmoid_backward", {"$0 * (Vec(T(1)) - $1) * $1", "$0 * (T(1) - $1) * $1", 2}},
      // threshold_backward(grad, self, threshold): self <= threshold ? 0 : grad
      {"aten::threshold_backward",
       {"Vec::blendv($0, Vec(T(0)), $1 <= $2)", "($1 <= $2) ? T(0) : $0", 3}},
      {"aten::maximum",
       {"at::vec::maximum($0, $1)",
        "($0 != $0 || $1 != $1) ? std::numeric_limits<T>::quiet_NaN() : std::max($0, $1)", 2}},
      {"aten::minimum",
       {"at::vec::minimum($0, $1)",
        "($0 != $0 || $1 != $1) ? std::numeric_limits<T>::quiet_NaN() : std::min($0, $1)", 2}},
      {"aten::clamp_min", {"at::vec::clamp_min($0, $1)", "std::max($0, $1)", 2}},
      {"aten::clamp_max", {"at::vec::clamp_max($0, $1)", "std::min($0, $1)", 2}},
      {"aten::addcmul", {"$0 + $3 * $1 * $2", "$0 + $3 * $1 * $2", 4}},
      // lerp(self, end, weight) with a scalar weight (LerpKernel: lerp_vec / lerp).
      {"aten::lerp.Scalar",
       {"at::vec::fmadd(Vec::blendv($2 - Vec(T(1)), $2, $2.abs() < Vec(T(0.5))), $1 - $0, "
        "Vec::blendv($1, $0, $2.abs() < Vec(T(0.5))))",
        "(std::abs($2) < T(0.5)) ? $0 + $2 * ($1 - $0) : $1 - ($1 - $0) * (T(1) - $2)", 3}},
      // A tensor plus or minus a scalar (add/sub with alpha 1: fmadd(b, 1, a) rounds once,
      // as a + b does).
      {"neuron::add_scalar", {"$0 + $1", "$0 + $1", 2}},
      {"neuron::sub_scalar", {"$0 - $1", "$0 - $1", 2}},
      {"aten::sqrt", {"", "", 1, true, "Sqrt"}},
      {"aten::exp", {"", "", 1, true, "Exp"}},
      {"aten::log", {"", "", 1, true, "Ln"}},
      {"aten::tanh", {"", "", 1, true, "Tanh"}},
      {"aten::erf", {"", "", 1, true, "Erf"}},
      {"aten::addcdiv", {"$0 + $3 * $1 / $2", "$0 + $3 * $1 / $2", 4}},
  };
  return f;
}

// Fast numerics only (KernelSpec::fast): formulas that are not ATen's, within the bounds
// README's numerics section gives (tests/python/test_numerics.py measures them). gelu with
// approximate='tanh' as ATen's vectorized formula writes it.
const std::unordered_map<std::string, Formula>& fast_formulas() {
  static const std::unordered_map<std::string, Formula> f = {
      {"aten::gelu[tanh]",
       {"Vec(T(0.5)) * $0 * (Vec(T(1)) + (Vec(T(M_SQRT2 * M_2_SQRTPI * 0.5)) * ($0 + Vec(T(0.044715)) * $0 * $0 * $0)).tanh())",
        "T(0.5) * $0 * (T(1) + std::tanh(T(M_SQRT2 * M_2_SQRTPI * 0.5) * ($0 + T(0.044715) * $0 * $0 * $0)))", 1}},
  };
  return f;
}
}  // namespace

const Formula* find_formula(const std::string& name) {
  auto it = formulas().find(name);
  return it == formulas().end() ? nullptr : &it->second;
}

const Formula* formula_for(const KernelOp& op, const KernelSpec& spec, std::string& why_not) {
  const Formula* f = find_formula(op.name);
  // Trailing constant arguments (gelu's approximate) select the formula: exact numerics
  // take only the variant ATen evaluates as we do.
  if ((op.name == "aten::gelu" || op.name == "aten::gelu_backward") && !op.args.empty()) {
    const KernelArg& last = op.args.back();
    const std::string variant = last.kind == KernelArg::kConst ? last.text : "?";
    if (variant == "tanh" && spec.fast && op.name == "aten::gelu") {
      f = &fast_formulas().at("aten::gelu[tanh]");
    } else if (variant != "none") {
      why_not = op.name + " with approximate='" + variant + "' has no native formula";
      return nullptr;
    }
  }
  if (f == nullptr) {
    why_not = op.name + " has no native formula";
    return nullptr;
  }
  if (spec.type == ElemType::kFloat32 && !f->float32 && !spec.fast) {
    why_not = op.name + " has no float32 native formula (ATen uses oneDNN for it; fast numerics allow ours)";
    return nullptr;
  }
  if (static_cast<int>(op.args.size()) < f->arity) {
    why_not = op.name + ": expected " + std::to_string(f->arity) + " arguments";
    return nullptr;
  }
  return f;
}

std::string substitute(const char* text, const std::vector<std::string>& args) {
  std::string out;
  for (const char* p = text; *p; ++p) {
    if (*p == '$' && p[1] >= '0' && p[1] <= '9') {
      out += "(" + args[static_cast<size_t>(p[1] - '0')] + ")";
      ++p;
    } else {
      out += *p;
    }
  }
  return out;
}

std::string kernel_prelude(const std::vector<std::string>& headers, const char* type, bool fast) {
  std::ostringstream src;
  src << "// generated by neuron-eager (fusion/codegen.cpp); do not edit" << (fast ? "; numerics: fast" : "") << "\n";
  for (const auto& h : headers) src << "#include <" << h << ">\n";
  src << "#include <algorithm>\n#include <cmath>\n#include <cstdint>\n#include <cstring>\n#include <limits>\n#include <type_traits>\n"
         "namespace {\nusing T = "
      << type
      << ";\nusing Vec = at::vec::Vectorized<T>;\n"
         "// Each op's result rounded as ATen's own kernel leaves it: the compiler contracts a\n"
         "// multiply and an add inside one op's expression (ATen's kernels are built that\n"
         "// way), never across two ops (ATen runs them as separate kernels).\n"
         "#if defined(CPU_CAPABILITY_AVX512)\n"
         "using Raw = std::conditional_t<std::is_same_v<T, float>, __m512, __m512d>;\n"
         "inline Vec keep(Vec v) { Raw r = v; __asm__(\"\" : \"+v\"(r)); return Vec(r); }\n"
         "#elif defined(CPU_CAPABILITY_AVX2)\n"
         "using Raw = std::conditional_t<std::is_same_v<T, float>, __m256, __m256d>;\n"
         "inline Vec keep(Vec v) { Raw r = v; __asm__(\"\" : \"+x\"(r)); return Vec(r); }\n"
         "#else\n"
         "inline Vec keep(Vec v) { __asm__(\"\" : \"+m\"(v)); return v; }\n"
         "#endif\n"
         "inline T keep(T s) { __asm__(\"\" : \"+m\"(s)); return s; }\n"
         "}\n";
  return src.str();
}

std::string vml_declarations(const std::vector<const Formula*>& fs, ElemType type) {
  // MKL's vector math as at::vml calls it: high accuracy, denormals kept, no errno. n is
  // passed as 64 bits so LP64 and ILP64 builds both read it right.
  std::string out;
  std::vector<std::string> declared;
  for (const Formula* f : fs)
    if (f != nullptr && f->vml && std::find(declared.begin(), declared.end(), f->vml) == declared.end()) {
      declared.push_back(f->vml);
      out += std::string("extern \"C\" void vm") + (type == ElemType::kFloat32 ? 's' : 'd') + f->vml +
             "(int64_t n, const T* a, T* r, int64_t mode);\n";
    }
  return out;
}

}  // namespace detail

using detail::Formula;
using detail::substitute;

bool native_op_supported(const std::string& name, ElemType type, bool fast) {
  const Formula* f = detail::find_formula(name);
  return f != nullptr && (type == ElemType::kFloat64 || f->float32 || fast);
}

std::optional<std::string> generate_kernel_source(const KernelSpec& spec, std::string& why_not) {
  if (spec.row > 0) return detail::generate_row_kernel_source(spec, why_not);
  const char* type = spec.type == ElemType::kFloat32 ? "float" : "double";
  const size_t n_ops = spec.ops.size();
  const auto n_ptrs = static_cast<size_t>(spec.pointers);
  std::vector<bool> scalar_used(static_cast<size_t>(spec.scalars), false);
  std::vector<bool> scalar_input_used(n_ptrs, false);

  // Ops computed in registers form stages; an op through MKL (vml) runs on a whole block
  // between two stages. Positions order them: stage s is 2s, a vml op after stage s is
  // 2s + 1. Values that cross a position live in a block buffer b<k>.
  std::vector<const Formula*> fs(n_ops);
  std::vector<int> pos(n_ops);
  std::vector<std::vector<std::string>> vargs(n_ops), sargs(n_ops);
  std::vector<std::vector<int>> value_args(n_ops);  // ops whose values op k reads
  std::vector<std::vector<int>> input_args(n_ops);  // pointers op k loads
  int stages = 1;
  for (size_t k = 0; k < n_ops; ++k) {
    const KernelOp& op = spec.ops[k];
    const Formula* found = detail::formula_for(op, spec, why_not);
    if (found == nullptr) return std::nullopt;
    const Formula& f = *found;
    fs[k] = &f;
    if (f.vml) {
      pos[k] = 2 * (stages - 1) + 1;
      ++stages;
    } else {
      pos[k] = 2 * (stages - 1);
    }
    vargs[k].assign(static_cast<size_t>(f.arity), "");
    sargs[k].assign(static_cast<size_t>(f.arity), "");
    for (int a = 0; a < f.arity; ++a) {
      const KernelArg& arg = op.args[static_cast<size_t>(a)];
      const size_t i = static_cast<size_t>(arg.index);
      switch (arg.kind) {
        case KernelArg::kValue:
          if (arg.index < 0 || static_cast<size_t>(arg.index) >= k) {
            why_not = op.name + ": reads a value not computed yet";
            return std::nullopt;
          }
          vargs[k][a] = "r" + std::to_string(arg.index);
          sargs[k][a] = "q" + std::to_string(arg.index);
          value_args[k].push_back(arg.index);
          break;
        case KernelArg::kInput:
          if (arg.index < 0 || i >= n_ptrs) return why_not = "pointer index out of range", std::nullopt;
          vargs[k][a] = "x" + std::to_string(i);
          sargs[k][a] = "y" + std::to_string(i);
          input_args[k].push_back(arg.index);
          break;
        case KernelArg::kScalarInput:
          if (arg.index < 0 || i >= n_ptrs) return why_not = "pointer index out of range", std::nullopt;
          scalar_input_used[i] = true;
          vargs[k][a] = "vc" + std::to_string(i);
          sargs[k][a] = "c" + std::to_string(i);
          break;
        case KernelArg::kScalar:
          if (arg.index < 0 || i >= scalar_used.size()) return why_not = "scalar index out of range", std::nullopt;
          scalar_used[i] = true;
          vargs[k][a] = "vs" + std::to_string(i);
          sargs[k][a] = "s" + std::to_string(i);
          break;
        case KernelArg::kConst:
          why_not = op.name + ": argument " + std::to_string(a) + " must be a tensor or scalar";
          return std::nullopt;
      }
    }
    if (f.vml && value_args[k].size() + input_args[k].size() != 1) {
      why_not = op.name + ": its operand must be a full-size tensor";
      return std::nullopt;
    }
    if (op.store >= spec.pointers) return why_not = "store index out of range", std::nullopt;
  }
  // Buffered values, and a check that no pointer is loaded after an earlier position
  // stored to it (the load would see the new value).
  std::vector<bool> buffered(n_ops, false);
  std::vector<int> first_store(n_ptrs, 1 << 30);
  for (size_t k = 0; k < n_ops; ++k) {
    if (fs[k]->vml) buffered[k] = true;
    for (int v : value_args[k])
      if (pos[static_cast<size_t>(v)] != pos[k] || fs[k]->vml) buffered[static_cast<size_t>(v)] = true;
    for (int p : input_args[k])
      if (first_store[static_cast<size_t>(p)] < pos[k]) {
        why_not = spec.ops[k].name + ": reads an operand that an earlier block step overwrote";
        return std::nullopt;
      }
    if (spec.ops[k].store >= 0) {
      int& fst = first_store[static_cast<size_t>(spec.ops[k].store)];
      fst = std::min(fst, pos[k]);
    }
  }

  std::ostringstream pre;
  for (int32_t i = 0; i < spec.scalars; ++i)
    if (scalar_used[static_cast<size_t>(i)])
      pre << "  const T s" << i << " = static_cast<T>(scalars[" << i << "]);\n  const Vec vs" << i
          << "(s" << i << ");\n";
  for (int32_t i = 0; i < spec.pointers; ++i) {
    pre << "  T* const p" << i << " = reinterpret_cast<T*>(ptrs[" << i << "]);\n";
    if (scalar_input_used[static_cast<size_t>(i)])
      pre << "  const T c" << i << " = *p" << i << ";\n  const Vec vc" << i << "(c" << i << ");\n";
  }

  // The loop over elements [lo, hi) for the register ops at position `at`: two vectors per
  // step and a scalar tail, as ATen's vectorized loop does. `off` is the block's first
  // element (buffers are indexed from it).
  auto emit_stage = [&](std::ostringstream& out, int at, const char* lo, const char* hi,
                        const std::string& ind) {
    std::ostringstream loads_vec, loads_tail, vec_body, tail_body;
    std::vector<bool> loaded(n_ptrs, false), value_loaded(n_ops, false);
    bool any = false;
    for (size_t k = 0; k < n_ops; ++k) {
      if (pos[k] != at || fs[k]->vml) continue;
      any = true;
      for (int p : input_args[k])
        if (!loaded[static_cast<size_t>(p)]) {
          loaded[static_cast<size_t>(p)] = true;
          loads_vec << ind << "      const Vec x" << p << " = Vec::loadu(p" << p << " + j);\n";
          loads_tail << ind << "    const T y" << p << " = p" << p << "[i];\n";
        }
      for (int v : value_args[k]) {
        const auto u = static_cast<size_t>(v);
        if (pos[u] == at || value_loaded[u]) continue;
        value_loaded[u] = true;
        loads_vec << ind << "      const Vec r" << v << " = Vec::loadu(b" << v << " + (j - " << lo << "));\n";
        loads_tail << ind << "    const T q" << v << " = b" << v << "[i - " << lo << "];\n";
      }
      vec_body << ind << "      const Vec r" << k << " = keep(" << substitute(fs[k]->vec, vargs[k]) << ");\n";
      tail_body << ind << "    const T q" << k << " = keep(static_cast<T>(" << substitute(fs[k]->scalar, sargs[k]) << "));\n";
      if (spec.ops[k].store >= 0) {
        vec_body << ind << "      r" << k << ".store(p" << spec.ops[k].store << " + j);\n";
        tail_body << ind << "    p" << spec.ops[k].store << "[i] = q" << k << ";\n";
      }
      if (buffered[k]) {
        vec_body << ind << "      r" << k << ".store(b" << k << " + (j - " << lo << "));\n";
        tail_body << ind << "    b" << k << "[i - " << lo << "] = q" << k << ";\n";
      }
    }
    if (!any) return;
    out << ind << "  int64_t i = " << lo << ";\n"
        << ind << "  // Two vectors per step and a scalar tail, as ATen's vectorized loop does.\n"
        << ind << "  for (; i + 2 * Vec::size() <= " << hi << "; i += 2 * Vec::size()) {\n"
        << ind << "    for (int64_t h = 0; h < 2; ++h) {\n"
        << ind << "      const int64_t j = i + h * Vec::size();\n"
        << loads_vec.str() << vec_body.str() << ind << "    }\n" << ind << "  }\n"
        << ind << "  for (; i < " << hi << "; ++i) {\n"
        << loads_tail.str() << tail_body.str() << ind << "  }\n";
  };

  std::ostringstream src;
  src << detail::kernel_prelude(spec.headers, type, spec.fast);
  src << detail::vml_declarations(fs, spec.type);
  src << "extern \"C\" __attribute__((visibility(\"default\"))) void " << kNativeSymbol
      << "(int64_t begin, int64_t end, char* const* ptrs, const double* scalars) {\n"
         "  (void)scalars;\n"
      << pre.str();
  if (stages == 1) {
    emit_stage(src, 0, "begin", "end", "");
    src << "}\n";
    return src.str();
  }
  // Blocks of a multiple of 64 elements, so vector tails fall only at the end, where
  // ATen's do.
  src << "  constexpr int64_t B = 1024;\n";
  for (size_t k = 0; k < n_ops; ++k)
    if (buffered[k]) src << "  alignas(64) T b" << k << "[B];\n";
  src << "  for (int64_t blo = begin; blo < end; blo += B) {\n"
         "    const int64_t bhi = std::min(end, blo + B);\n";
  for (int at = 0; at < 2 * stages - 1; ++at) {
    if (at % 2 == 0) {
      src << "    {\n";
      emit_stage(src, at, "blo", "bhi", "    ");
      src << "    }\n";
      continue;
    }
    for (size_t k = 0; k < n_ops; ++k) {
      if (pos[k] != at) continue;
      const std::string in = value_args[k].empty() ? "p" + std::to_string(input_args[k][0]) + " + blo"
                                                   : "b" + std::to_string(value_args[k][0]);
      src << "    vm" << (spec.type == ElemType::kFloat32 ? 's' : 'd') << fs[k]->vml << "(bhi - blo, " << in
          << ", b" << k << ", 0x2 | 0x140000 | 0x100);\n";
      if (spec.ops[k].store >= 0)
        src << "    std::memcpy(p" << spec.ops[k].store << " + blo, b" << k << ", (bhi - blo) * sizeof(T));\n";
    }
  }
  src << "  }\n}\n";
  return src.str();
}

}  // namespace neuron::fusion
