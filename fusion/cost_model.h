// Predicted device time of ops and fused segments, for offline replay: either from what a
// trace measured (OpExecute, SegmentExecute) or from an analytical Trainium2 NeuronCore
// model. Every constant of the model is documented with its public source in
// docs/heuristics.md; the ones marked "assumption" are ours.
#pragma once

#include <cstdint>

namespace neuron::fusion {

enum class CostSource { kMeasured, kTrn2 };

// One NeuronCore-v3 (a Trainium2 chip has eight).
struct Trn2Model {
  // Trainium2: 2.9 TB/s HBM per chip, shared by 8 cores (AWS Neuron docs, "Trainium2
  // Architecture"); an even share per core is our assumption.
  double hbm_bytes_per_s = 2.9e12 / 8;
  // NeuronCore-v3 Tensor Engine: 79 BF16/FP16/TF32 TFLOPS ("NeuronCore-v3 Architecture");
  // FP32 matmuls run at the chip's 181 FP32 TFLOPS / 8 cores.
  double tensor_flops_per_s = 181e12 / 8;
  // Vector/Scalar engines for elementwise work: NeuronCore-v2 published 2.3 TFLOPS FP32
  // (vector); v3 is at least that (assumption: same rate), one FLOP per element per op.
  double vector_flops_per_s = 2.3e12;
  // Fixed cost of launching one kernel (one program execution) from the host runtime:
  // not published; assumption (order of a Neuron runtime execute call).
  double launch_overhead_ns = 15000;
  // On-chip SRAM per NeuronCore-v3: 28 MB ("NeuronCore-v3 Architecture"). A fused
  // segment's intermediates larger than this are assumed to spill to HBM.
  double sbuf_bytes = 28e6;
};

struct CostModel {
  CostSource source = CostSource::kMeasured;
  Trn2Model trn2;
  // Measured mode: fused time / per-op time for segments never measured fused, when the
  // trace has no fused segment to calibrate it (then it is fitted from the trace).
  double fused_ratio_default = 1.0;
};

// Analytical time of one op run on its own: launch + the slower of memory and compute.
double trn2_op_ns(const Trn2Model& m, uint64_t bytes, uint64_t matmul_flops, uint64_t elements);
// Of a fused segment: one launch; HBM traffic of its external inputs, live outputs and
// spilled intermediates; its compute.
double trn2_segment_ns(const Trn2Model& m, uint64_t hbm_bytes, uint64_t matmul_flops,
                       uint64_t elements);

}  // namespace neuron::fusion
