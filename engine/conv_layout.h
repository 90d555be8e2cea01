// Output strides of queued convolutions as CPU eager gives them (conv_layout.cpp).
#pragma once

#include <string>
#include <vector>

#include "engine/pch.h"
#include "trace/op_record.h"

namespace neuron::engine {

// Rewrites the strides of aten::convolution's output, or of aten::convolution_backward's
// grad_input and grad_weight, into the memory format CPU's kernel choice gives them.
// outs holds the written arguments first; first_return indexes the first return.
void match_cpu_conv_layout(const std::string& op_name, c10::ArrayRef<c10::IValue> args,
                           std::vector<trace::TensorMeta>& outs, size_t first_return);

}  // namespace neuron::engine
