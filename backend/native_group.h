// Tier 2 for one tile group of a fused program: the generated kernel, how its pointers
// and scalars are bound to each run's ops, and its life cycle. A group starts on tier 1;
// once hot enough (policy) its kernel is built in the background; the next runs check it
// against tier 1 (same bits, timed) and it is swapped in only if equal and faster. A build
// failure is retried with backoff; nothing here can change a result.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "backend/op_work.h"
#include "fusion/codegen.h"
#include "fusion/planner.h"
#include "fusion/policy.h"

namespace neuron::backend {

struct NativeBinding {
  // Foreach groups bind element i of every list: the input tensor `index + i`, output i,
  // and element i of a per-tensor scalar list.
  struct Pointer {
    uint32_t op = 0;      // op of the group (0-based)
    bool output = false;  // the op's output, else its input tensor `index`
    uint32_t index = 0;
  };
  struct Scalar {
    uint32_t op = 0;
    bool from_tensor = false;  // a host tensor input (wrapped number), else argument `index`
    uint32_t index = 0;
  };
  std::vector<Pointer> pointers;
  std::vector<Scalar> scalars;
  // Foreach groups: every tensor the ops name, with the pointer the kernel reads it
  // through, so each run can check that element i aliases as element 0 did.
  std::vector<std::pair<Pointer, uint32_t>> refs;
  std::vector<bool> written;  // per pointer: the group writes it
};

// Copies, taken before tier 1 runs a foreach group on trial, of everything the group
// writes (its ops update tensors in place): tier 2 then runs on them.
struct ForeachSnapshot {
  std::vector<char*> addresses;  // per element, per pointer: the copy, or null (read only)
  std::vector<at::Tensor> buffers;
};

// Counters (trace/counters.h): native_requested, native_unsupported, native_built,
// native_build_failures, native_accepted, native_rejected_slower, native_rejected_mismatch,
// native_runs, native_foreach_tier1_elements.

class NativeGroup : public std::enable_shared_from_this<NativeGroup> {
 public:
  enum State : int { kIdle, kUnsupported, kBuilding, kTrial, kAccepted, kRejected, kFailed };

  NativeGroup(const fusion::Policy& policy, uint64_t segment_key)
      : policy_(policy), segment_key_(segment_key) {}

  // Before the group's first run: a kernel that an earlier run (or process) built and
  // verified is taken from the cache at once, so tier 2 runs from the first fused run.
  void before_first_run(const std::vector<std::unique_ptr<OpWork>>& ops, const fusion::Step& step);
  // Runs the group: tier 2 when accepted (returns true), else false (the caller runs tier
  // 1 and then calls after_tier1 with its time).
  bool try_run(const std::vector<std::unique_ptr<OpWork>>& ops, const fusion::Step& step);
  void after_tier1(const std::vector<std::unique_ptr<OpWork>>& ops, const fusion::Step& step,
                   uint64_t tier1_ns, const ForeachSnapshot* snapshot = nullptr);
  // Foreach groups on trial: the copies tier 2 will run on (null when not on trial).
  std::unique_ptr<ForeachSnapshot> before_tier1(const std::vector<std::unique_ptr<OpWork>>& ops,
                                                const fusion::Step& step);
  State state() const { return static_cast<State>(state_.load()); }

  // Tier 1 runs a group tile by tile, or its ops one after the other on whole tensors
  // (each kernel with its own threads). The first runs try both, timed; the faster wins.
  bool run_whole_next();
  void note_tier1(bool whole, uint64_t ns);
  // Whether a tier-2 kernel runs side by side with tier 1 (its trial): such runs take
  // both tiers' time, not what the group will run at.
  bool on_native_trial() const { return state_.load() == kTrial; }
  // Whether the cost gate still waits for tier-1 runs before it decides on a build (at
  // most native_min_runs): the guard does not demote a key on tier 1's figures while one
  // of its groups may still ask for a kernel.
  bool tier2_needs_runs();
  // Whether a kernel arrived: built and waiting for its trial against tier 1, or accepted.
  bool tier2_arrived() const {
    const int s = state_.load();
    return s == kTrial || s == kAccepted;
  }

 private:
  // The group's kernel source (spec from build_spec, ATen's vec headers), or std::nullopt
  // with why_not set.
  std::optional<std::string> kernel_source(const std::vector<std::unique_ptr<OpWork>>& ops,
                                           const fusion::Step& step, std::string& why_not);
  bool build_spec(const std::vector<std::unique_ptr<OpWork>>& ops, const fusion::Step& step,
                  fusion::KernelSpec& spec, std::string& why_not);
  bool build_foreach_spec(const std::vector<std::unique_ptr<OpWork>>& ops, const fusion::Step& step,
                          fusion::KernelSpec& spec, std::string& why_not);
  // Keeps a finished spec's binding for the runs (the spec counts its pointers and
  // scalars); true.
  bool keep_binding(NativeBinding binding, fusion::KernelSpec& spec);
  // Runs the kernel on every element of the lists whose tensors alias as the spec's do
  // (the others run on tier 1); `override` replaces addresses (trials).
  void run_foreach_kernel(const std::vector<std::unique_ptr<OpWork>>& ops, const fusion::Step& step,
                          const ForeachSnapshot* override);
  void trial_foreach(const std::vector<std::unique_ptr<OpWork>>& ops, const fusion::Step& step,
                     uint64_t tier1_ns, const ForeachSnapshot& snapshot);
  void judge(bool equal, uint64_t tier1_ns, uint64_t tier2_ns);
  void request(const std::vector<std::unique_ptr<OpWork>>& ops, const fusion::Step& step);
  void run_kernel(const std::vector<std::unique_ptr<OpWork>>& ops, const fusion::Step& step,
                  const std::vector<char*>* output_override);
  void trial(const std::vector<std::unique_ptr<OpWork>>& ops, const fusion::Step& step,
             uint64_t tier1_ns);

  fusion::Policy policy_;
  uint64_t segment_key_ = 0;
  std::atomic<int> state_{kIdle};
  std::atomic<bool> probed_{false};
  std::atomic<fusion::NativeKernelFn> fn_{nullptr};
  NativeBinding binding_;
  fusion::ElemType type_ = fusion::ElemType::kFloat32;
  std::string kernel_key_;
  std::mutex mutex_;  // the fields below (programs are shared by every stream)
  uint64_t tier1_runs_ = 0, tier1_total_ns_ = 0;
  uint32_t build_failures_ = 0;
  uint64_t retry_after_ns_ = 0;
  std::vector<uint64_t> trial_tier1_, trial_tier2_;
  std::vector<uint64_t> whole_ns_, tiled_ns_;
  std::atomic<int> tier1_choice_{0};  // 0 trying, 1 tiled, 2 whole
};

}  // namespace neuron::backend
