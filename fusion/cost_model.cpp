#include "fusion/cost_model.h"

#include <algorithm>

namespace neuron::fusion {

double trn2_op_ns(const Trn2Model& m, uint64_t bytes, uint64_t flops, uint64_t elements) {
  const double memory = static_cast<double>(bytes) / m.hbm_bytes_per_s;
  const double compute = static_cast<double>(flops) / m.tensor_flops_per_s +
                         static_cast<double>(elements) / m.vector_flops_per_s;
  return m.launch_overhead_ns + 1e9 * std::max(memory, compute);
}

double trn2_segment_ns(const Trn2Model& m, uint64_t hbm_bytes, uint64_t flops,
                       uint64_t elements) {
  return trn2_op_ns(m, hbm_bytes, flops, elements);
}

}  // namespace neuron::fusion
