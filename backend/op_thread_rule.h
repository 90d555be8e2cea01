// Whether a work item's bits depend on its intra-op thread count: each op carries a rule
// (OpWork::threads), applied to its tensors when it runs (op_thread_rule.cpp), with a
// trial per geometry for matmuls and dim reductions (thread_trial.cpp).
#pragma once

#include <cstdint>

namespace neuron::fusion {
struct Policy;
}

namespace neuron::backend {

class OpWork;

// How a work item's bits depend on its intra-op thread count.
enum class ThreadRule : uint8_t {
  kFixed,        // they may (reductions, matmuls, FFT, ...): always CPU eager's count
  kFree,         // they never do (tile groups, layer norm: each row on one thread)
  kElementwise,  // elementwise kernels: only where ATen's split points fall on vector
                 // boundaries (checked per item, see thread_free())
  kRowLastDim,   // softmax / log_softmax (and log_softmax's backward): free over the last
                 // dim (one row per thread)
  kMatmul,       // matmuls: free where a trial per geometry finds equal bits (thread_trial.cpp)
  kReduction,    // dim reductions (sum, mean): likewise
};
// (MKL's matmuls are not free in general: a 10x64 @ 64x256 float product differs in its
// last bits between 1 and 2 threads; most shapes do not.)

// Whether a kMatmul / kReduction item's bits are equal at one thread and at CPU eager's
// count: decided once per geometry (op, sizes, strides, offsets, scalar arguments) on the
// calling worker by running the op on random inputs both ways (thread_trial.cpp). The
// trial runs while the worker is idle (run_deferred_thread_trial); until its verdict the
// geometry counts as not free.
bool trial_thread_free(const OpWork& work);
// The worker's idle hook (Stream::set_idle_hook): runs the oldest deferred trial of the
// calling worker, abandoning it (kept for the next idle time) as soon as an item is
// queued. Whether there was one.
bool run_deferred_thread_trial();
// Counters (trace/counters.h): thread_trials_deferred (geometries queued for a trial),
// thread_trials (geometries tried), thread_free_geometries (of which equal bits: they run
// as free items), thread_trials_given_up (left fixed: their trial gave way to queued items
// 8 times).
// The policy's thread_trial_sightings, thread_trial_runs and thread_trial_min_output
// (called by set_thread_policy).
void set_thread_trial_policy(const fusion::Policy& policy);

}  // namespace neuron::backend
