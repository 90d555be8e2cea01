// Predicted device time in offline replay: each op run on its own, and fused segments,
// from what the trace measured or from the Trainium2 model (cost_model.h).
#pragma once

#include <cstdint>
#include <vector>

#include "fusion/cost_model.h"
#include "fusion/replay.h"

namespace neuron::fusion {

// Predicted time of each op run on its own.
std::vector<double> per_op_costs(const ReplayTrace& t, const CostModel& cost);
// Fused time / per-op time over the trace's fused segments in measured mode (it prices
// segments never measured fused); cost.fused_ratio_default otherwise.
double fused_ratio(const ReplayTrace& t, const CostModel& cost, const std::vector<double>& op_ns);
// A fused segment of these ops (trace indices) on the Trainium2 model: HBM traffic of
// external inputs (once each), live outputs and spills.
double trn2_fused_ns(const ReplayTrace& t, const Trn2Model& model, const std::vector<uint32_t>& open);

}  // namespace neuron::fusion
