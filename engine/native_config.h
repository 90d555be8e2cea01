// Tier 2's compiler (fusion::NativeCompiler) as the engine configures it.
#pragma once

namespace neuron::engine {

// Tier 2's compiler setup, once: the compiler (NEURON_CXX), ATen's own ISA flags (so the
// generated kernels evaluate what ATen's kernels evaluate), torch's headers, the cache.
void configure_native_once();

}  // namespace neuron::engine
