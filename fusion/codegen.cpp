#include "fusion/codegen.h"

#include <sstream>
#include <unordered_map>

namespace neuron::fusion {
namespace {

// Per op: the expression ATen's CPU kernel evaluates, for a whole vector (at::vec) and for
// one tail element. $0..$3 are the schema arguments. Each mirrors the kernel's own text
// (operation order matters for bits): BinaryOpsKernel, UnaryOpsKernel, Activation,
// GeluKernel, PointwiseOpsKernel and the ufunc add in ATen. Only ops checked bit for bit
// against ATen (tests/python/test_native.py) are listed: exp, log, sin, cos, tanh, erf and
// sqrt go through MKL's vector math in ATen, and float32 gelu through oneDNN, so they are
// left to tier 1.
struct Formula {
  const char* vec;
  const char* scalar;
  int arity;
  bool float32 = true;  // false: ATen's float32 kernel is not this formula (double only)
};

const std::unordered_map<std::string, Formula>& formulas() {
  static const std::unordered_map<std::string, Formula> f = {
      {"aten::add.Tensor", {"at::vec::fmadd($1, $2, $0)", "$0 + $2 * $1", 3}},
      {"aten::add.Scalar", {"at::vec::fmadd($1, $2, $0)", "$0 + $2 * $1", 3}},
      {"aten::sub.Tensor", {"at::vec::fmadd($1, $2.neg(), $0)", "$0 + (-$2) * $1", 3}},
      {"aten::rsub.Tensor", {"at::vec::fmadd($0, $2.neg(), $1)", "$1 + (-$2) * $0", 3}},
      {"aten::mul.Tensor", {"$0 * $1", "$0 * $1", 2}},
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
      {"aten::addcdiv", {"$0 + $3 * $1 / $2", "$0 + $3 * $1 / $2", 4}},
  };
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

}  // namespace

bool native_op_supported(const std::string& name, ElemType type) {
  auto it = formulas().find(name);
  return it != formulas().end() && (type == ElemType::kFloat64 || it->second.float32);
}

std::optional<std::string> generate_kernel_source(const KernelSpec& spec, std::string& why_not) {
  const char* type = spec.type == ElemType::kFloat32 ? "float" : "double";
  std::ostringstream pre, vec_body, tail_body, loads_vec, loads_tail;
  std::vector<bool> input_used(static_cast<size_t>(spec.pointers), false);
  std::vector<bool> scalar_used(static_cast<size_t>(spec.scalars), false);
  std::vector<bool> scalar_input_used(static_cast<size_t>(spec.pointers), false);

  std::vector<std::string> vargs, sargs;
  for (size_t k = 0; k < spec.ops.size(); ++k) {
    const KernelOp& op = spec.ops[k];
    auto it = formulas().find(op.name);
    if (it == formulas().end()) {
      why_not = op.name + " has no native formula";
      return std::nullopt;
    }
    const Formula& f = it->second;
    if (spec.type == ElemType::kFloat32 && !f.float32) {
      why_not = op.name + " has no float32 native formula (ATen uses oneDNN for it)";
      return std::nullopt;
    }
    // Trailing constant arguments (gelu's approximate) select the formula; only the
    // exact variant we mirror is accepted.
    if (op.name == "aten::gelu" || op.name == "aten::gelu_backward") {
      const KernelArg& last = op.args.back();
      if (last.kind != KernelArg::kConst || last.text != "none") {
        why_not = op.name + " with approximate='" + last.text + "' has no native formula";
        return std::nullopt;
      }
    }
    if (static_cast<int>(op.args.size()) < f.arity) {
      why_not = op.name + ": expected " + std::to_string(f.arity) + " arguments";
      return std::nullopt;
    }
    vargs.assign(static_cast<size_t>(f.arity), "");
    sargs.assign(static_cast<size_t>(f.arity), "");
    for (int a = 0; a < f.arity; ++a) {
      const KernelArg& arg = op.args[static_cast<size_t>(a)];
      const size_t i = static_cast<size_t>(arg.index);
      switch (arg.kind) {
        case KernelArg::kValue:
          if (arg.index < 0 || static_cast<size_t>(arg.index) >= k) {
            why_not = op.name + ": reads a value not computed yet";
            return std::nullopt;
          }
          vargs[a] = "r" + std::to_string(arg.index);
          sargs[a] = "q" + std::to_string(arg.index);
          break;
        case KernelArg::kInput:
          if (i >= input_used.size()) return why_not = "pointer index out of range", std::nullopt;
          input_used[i] = true;
          vargs[a] = "x" + std::to_string(i);
          sargs[a] = "y" + std::to_string(i);
          break;
        case KernelArg::kScalarInput:
          if (i >= scalar_input_used.size()) return why_not = "pointer index out of range", std::nullopt;
          scalar_input_used[i] = true;
          vargs[a] = "vc" + std::to_string(i);
          sargs[a] = "c" + std::to_string(i);
          break;
        case KernelArg::kScalar:
          if (i >= scalar_used.size()) return why_not = "scalar index out of range", std::nullopt;
          scalar_used[i] = true;
          vargs[a] = "vs" + std::to_string(i);
          sargs[a] = "s" + std::to_string(i);
          break;
        case KernelArg::kConst:
          why_not = op.name + ": argument " + std::to_string(a) + " must be a tensor or scalar";
          return std::nullopt;
      }
    }
    vec_body << "      const Vec r" << k << " = " << substitute(f.vec, vargs) << ";\n";
    tail_body << "    const T q" << k << " = static_cast<T>(" << substitute(f.scalar, sargs)
              << ");\n";
    if (op.store >= 0) {
      if (op.store >= spec.pointers) return why_not = "store index out of range", std::nullopt;
      vec_body << "      r" << k << ".store(p" << op.store << " + j);\n";
      tail_body << "    p" << op.store << "[i] = q" << k << ";\n";
    }
  }

  for (int32_t i = 0; i < spec.scalars; ++i)
    if (scalar_used[static_cast<size_t>(i)])
      pre << "  const T s" << i << " = static_cast<T>(scalars[" << i << "]);\n  const Vec vs" << i
          << "(s" << i << ");\n";
  for (int32_t i = 0; i < spec.pointers; ++i) {
    const size_t u = static_cast<size_t>(i);
    pre << "  T* const p" << i << " = reinterpret_cast<T*>(ptrs[" << i << "]);\n";
    if (scalar_input_used[u])
      pre << "  const T c" << i << " = *p" << i << ";\n  const Vec vc" << i << "(c" << i << ");\n";
    if (input_used[u]) {
      loads_vec << "      const Vec x" << i << " = Vec::loadu(p" << i << " + j);\n";
      loads_tail << "    const T y" << i << " = p" << i << "[i];\n";
    }
  }

  std::ostringstream src;
  src << "// generated by neuron-eager (fusion/codegen.cpp); do not edit\n"
         "#include <ATen/cpu/vec/vec.h>\n"
         "#include <ATen/cpu/vec/functional.h>\n"
         "#include <algorithm>\n#include <cmath>\n#include <cstdint>\n#include <limits>\n"
         "namespace {\nusing T = "
      << type
      << ";\nusing Vec = at::vec::Vectorized<T>;\n}\n"
         "extern \"C\" __attribute__((visibility(\"default\"))) void "
      << kNativeSymbol
      << "(int64_t begin, int64_t end, char* const* ptrs, const double* scalars) {\n"
         "  (void)scalars;\n"
      << pre.str()
      << "  int64_t i = begin;\n"
         "  // Two vectors per step and a scalar tail, as ATen's vectorized loop does.\n"
         "  for (; i + 2 * Vec::size() <= end; i += 2 * Vec::size()) {\n"
         "    for (int64_t h = 0; h < 2; ++h) {\n"
         "      const int64_t j = i + h * Vec::size();\n"
      << loads_vec.str() << vec_body.str()
      << "    }\n  }\n"
         "  for (; i < end; ++i) {\n"
      << loads_tail.str() << tail_body.str() << "  }\n}\n";
  return src.str();
}

}  // namespace neuron::fusion
