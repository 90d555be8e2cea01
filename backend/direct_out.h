// Out variants that write straight into the worker's outputs, for ops that reach the
// device with a CPU kernel of their own and whose ATen out= variant is generated
// (CompositeExplicitAutograd: the functional kernel into fresh memory, then a copy):
// native_layer_norm and its backward. Each runs the kernel CPU eager runs, on the same
// inputs, into our preallocated outputs: the same bits without the extra pass over the
// result (a 4096x1024 LayerNorm on the worker spent a third of its time in that copy:
// 4.45 ms, 2.45-2.7 ms direct; CPU eager 3.3-4.2). Ops that are CompositeExplicitAutograd
// themselves (clone, _to_copy, embedding) never get here: they reach the device as
// empty + copy_ or index_select already.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>
#include <string>

namespace neuron::backend {

// The direct out variant of schema `name`.`overload` (e.g. "aten::native_layer_norm", ""),
// if there is one: an op of the neuron_direct library whose arguments are the functional
// op's followed by its outputs, the layout OpWork::build_stack gives an out variant.
std::optional<c10::OperatorHandle> direct_out_variant(const std::string& name, const std::string& overload);

}  // namespace neuron::backend
