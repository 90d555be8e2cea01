// Unboxed entry points for the hottest ops. They run the same fallback, but push their
// tensor arguments on the stack as borrowed values: a boxed call copies `self` into the
// stack, and under torch 2.13's PyObject preservation the first C++ reference to a tensor
// Python owns takes the GIL twice (incref, then decref of the Python object). That pair
// was 12% of the host instructions of a tiny `a + b` on neuron (callgrind) and is work CPU
// eager never does.
#include <ATen/ops/_log_softmax_ops.h>
#include <ATen/ops/_softmax_ops.h>
#include <ATen/ops/add_ops.h>
#include <ATen/ops/addcmul_ops.h>
#include <ATen/ops/addmm_ops.h>
#include <ATen/ops/bmm_ops.h>
#include <ATen/ops/div_ops.h>
#include <ATen/ops/exp_ops.h>
#include <ATen/ops/gelu_backward_ops.h>
#include <ATen/ops/gelu_ops.h>
#include <ATen/ops/mean_ops.h>
#include <ATen/ops/mm_ops.h>
#include <ATen/ops/mul_ops.h>
#include <ATen/ops/neg_ops.h>
#include <ATen/ops/pow_ops.h>
#include <ATen/ops/relu_ops.h>
#include <ATen/ops/rsqrt_ops.h>
#include <ATen/ops/sigmoid_ops.h>
#include <ATen/ops/silu_backward_ops.h>
#include <ATen/ops/silu_ops.h>
#include <ATen/ops/sub_ops.h>
#include <ATen/ops/sum_ops.h>
#include <ATen/ops/tanh_ops.h>
#include <ATen/ops/threshold_backward_ops.h>
#include <ATen/ops/where_ops.h>

#include <array>
#include <type_traits>

#include "engine/dispatch.h"
#include "engine/pch.h"
#include "trace/log.h"

namespace neuron::engine {

void BorrowedArgs::make_owned() {
  if (!borrowed) return;
  for (size_t i = stack->size() - count; i < stack->size(); ++i) {
    c10::IValue& v = (*stack)[i];
    if (!v.isTensor()) continue;
    c10::IValue owned(v.toTensor());  // a counted reference
    c10::MaybeOwnedTraits<c10::IValue>::destroyBorrow(v);  // dropped without one
    v = std::move(owned);
  }
  borrowed = false;
}

void BorrowedArgs::forget() {
  if (borrowed)
    for (size_t i = stack->size() - count; i < stack->size(); ++i)
      if ((*stack)[i].isTensor()) c10::MaybeOwnedTraits<c10::IValue>::destroyBorrow((*stack)[i]);
  borrowed = false;
}

void BorrowedArgs::drop() {
  forget();
  stack->erase(stack->end() - static_cast<std::ptrdiff_t>(count), stack->end());
  count = 0;
}

namespace {

template <class A>
void push_arg(torch::jit::Stack& stack, const A& a) {
  if constexpr (std::is_same_v<A, at::Tensor>) {
    stack.emplace_back(c10::MaybeOwnedTraits<at::Tensor>::createBorrow(a));
  } else if constexpr (std::is_same_v<A, std::optional<at::Tensor>>) {
    if (a.has_value())
      stack.emplace_back(c10::MaybeOwnedTraits<at::Tensor>::createBorrow(*a));
    else
      stack.emplace_back();
  } else {
    stack.emplace_back(a);
  }
}

template <class A>
at::Tensor* mutable_tensor(A&& a) {
  if constexpr (std::is_same_v<A, at::Tensor&>)
    return &a;
  else
    return nullptr;
}

// One reused stack per thread; a nested call (none is expected) gets its own.
struct StackLease {
  static thread_local torch::jit::Stack t_stack;
  static thread_local bool t_busy;
  torch::jit::Stack local;
  torch::jit::Stack* stack;
  StackLease() : stack(t_busy ? &local : &t_stack) {
    if (stack == &t_stack) t_busy = true;
  }
  ~StackLease() {
    stack->clear();
    if (stack == &t_stack) t_busy = false;
  }
};
thread_local torch::jit::Stack StackLease::t_stack;
thread_local bool StackLease::t_busy = false;

template <class Op, class Sig = typename Op::schema>
struct Fast;

template <class Op, class Ret, class... Args>
struct Fast<Op, Ret(Args...)> {
  static const c10::OperatorHandle& handle() {
    static const c10::OperatorHandle h =
        c10::Dispatcher::singleton().findSchemaOrThrow(Op::name, Op::overload_name);
    return h;
  }

  static Ret call(Args... args) {
    const c10::OperatorHandle& op = handle();
    StackLease lease;
    torch::jit::Stack& stack = *lease.stack;
    (push_arg<std::decay_t<Args>>(stack, args), ...);
    BorrowedArgs borrowed{&stack, sizeof...(Args)};
    try {
      neuron_fallback(op, &stack, &borrowed);
    } catch (...) {
      borrowed.forget();
      throw;
    }
    if constexpr (std::is_same_v<Ret, at::Tensor>) {
      TORCH_INTERNAL_ASSERT(stack.size() == 1);
      return std::move(stack.back()).toTensor();
    } else {
      static_assert(std::is_same_v<Ret, at::Tensor&>, "fast ops return a tensor or an argument");
      // An in-place or out= op returns the argument it wrote.
      const std::array<at::Tensor*, sizeof...(Args)> writable{mutable_tensor<Args>(args)...};
      const OpInfo& info = op_info(op);
      TORCH_INTERNAL_ASSERT(info.returns.size() == 1 && info.returns[0].alias_arg >= 0);
      at::Tensor* out = writable[static_cast<size_t>(info.returns[0].alias_arg)];
      TORCH_INTERNAL_ASSERT(out != nullptr);
      return *out;
    }
  }
};

template <class Op>
void add_fast(torch::Library& library, size_t& added) {
  const c10::OperatorHandle& op = Fast<Op>::handle();
  // Only ops with a CPU kernel and nothing of ours yet: a composite (decomposed before
  // PrivateUse1) or a native kernel keeps its own route.
  if (!op.hasKernelForDispatchKey(c10::DispatchKey::CPU) ||
      op.hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1))
    return;
  const std::string name = std::string(Op::name).substr(6) +
                           (*Op::overload_name ? "." + std::string(Op::overload_name) : "");
  library.impl(name.c_str(), TORCH_FN(Fast<Op>::call));
  ++added;
}

}  // namespace

void register_fast_ops() {
  static auto* library = new torch::Library(torch::Library::IMPL, "aten",
                                            c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  size_t added = 0;
  auto& l = *library;
  add_fast<at::_ops::add_Tensor>(l, added);
  add_fast<at::_ops::add__Tensor>(l, added);
  add_fast<at::_ops::sub_Tensor>(l, added);
  add_fast<at::_ops::sub__Tensor>(l, added);
  add_fast<at::_ops::mul_Tensor>(l, added);
  add_fast<at::_ops::mul__Tensor>(l, added);
  add_fast<at::_ops::div_Tensor>(l, added);
  add_fast<at::_ops::div__Tensor>(l, added);
  add_fast<at::_ops::addcmul_>(l, added);
  add_fast<at::_ops::mm>(l, added);
  add_fast<at::_ops::addmm>(l, added);
  add_fast<at::_ops::bmm>(l, added);
  add_fast<at::_ops::relu>(l, added);
  add_fast<at::_ops::gelu>(l, added);
  add_fast<at::_ops::gelu_backward>(l, added);
  add_fast<at::_ops::silu>(l, added);
  add_fast<at::_ops::silu_backward>(l, added);
  add_fast<at::_ops::threshold_backward>(l, added);
  add_fast<at::_ops::tanh>(l, added);
  add_fast<at::_ops::sigmoid>(l, added);
  add_fast<at::_ops::exp>(l, added);
  add_fast<at::_ops::neg>(l, added);
  add_fast<at::_ops::rsqrt>(l, added);
  add_fast<at::_ops::pow_Tensor_Scalar>(l, added);
  add_fast<at::_ops::mean_dim>(l, added);
  add_fast<at::_ops::sum_dim_IntList>(l, added);
  add_fast<at::_ops::_softmax>(l, added);
  add_fast<at::_ops::_log_softmax>(l, added);
  add_fast<at::_ops::where_self>(l, added);
  trace::log(trace::LogLevel::kDebug, "unboxed fast entry points for " + std::to_string(added) + " ops");
}

}  // namespace neuron::engine
