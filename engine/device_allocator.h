// Allocators of the `neuron` backend: device memory (registered with c10 for
// PrivateUse1) and pinned host memory (handed out by the hooks).
#pragma once

#include <c10/core/Allocator.h>

namespace neuron::engine {

c10::Allocator* pinned_allocator();
bool is_pinned_pointer(const void* ptr);

}  // namespace neuron::engine
