// Policies: the built-in ones, the cost gate and tier-2 decisions, the segmenting settings
// a policy gives (policy_text.cpp: knobs by name, policy files, printing).
#include "fusion/policy.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>

namespace neuron::fusion {

namespace {
std::atomic<Numerics> g_default_numerics{Numerics::kExact};
}  // namespace

Numerics default_numerics() { return g_default_numerics.load(std::memory_order_relaxed); }
void set_default_numerics(Numerics numerics) { g_default_numerics.store(numerics, std::memory_order_relaxed); }

const std::vector<std::string>& matmul_class_ops() {
  static const std::vector<std::string> ops = {
      "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::convolution",
      "aten::convolution_backward", "aten::_scaled_dot_product_flash_attention_for_cpu",
      "aten::_scaled_dot_product_flash_attention_for_cpu_backward"};
  return ops;
}

trace::SegmentPolicy segment_policy_of(const Policy& policy, const std::vector<uint32_t>& matmul_ops) {
  trace::SegmentPolicy p;
  p.max_length = policy.max_segment_length;
  p.rolling_window = policy.rolling_window;
  p.loop_min_ops = policy.loop_cut_min_ops > 0 ? policy.loop_cut_min_ops : policy.max_segment_length / 2;
  p.rolling_mask = (uint64_t{1} << policy.rolling_bits) - 1;
  p.use_rolling_cut = policy.rolling_bits > 0;
  p.keep_runs_whole = policy.foreach_runs_whole;
  p.rolling_shapes = policy.rolling_shapes;
  if (policy.cut_after_matmul) p.cut_after = matmul_ops;
  return p;
}

bool Policy::should_compile(uint32_t n, Tier t) const {
  if (n < min_fusible_ops) return false;
  const double cost = t == Tier::kNative ? compile_cost_us_native : compile_cost_us_instant;
  return per_op_saving_us * n * expected_repeats > cost;
}

bool Policy::should_build_native(uint64_t tier1_total_ns, uint64_t tier1_runs) const {
  if (tier == Tier::kNative) return true;
  if (tier == Tier::kInstant || tier1_runs == 0 || tier1_runs < native_min_runs) return false;
  const double mean_us = static_cast<double>(tier1_total_ns) / static_cast<double>(tier1_runs) / 1000.0;
  return mean_us * native_saving * expected_repeats > compile_cost_us_native;
}

uint64_t Policy::native_retry_delay_ns(uint32_t failures) const {
  const double ns = native_retry_after_us * 1000.0 * std::pow(native_retry_growth, failures > 0 ? failures - 1 : 0);
  return ns >= 1.8e19 ? UINT64_MAX : static_cast<uint64_t>(ns);
}

int64_t Policy::native_tile(int64_t numel) const {
  const auto tiles = static_cast<int64_t>(native_tiles);
  return std::max<int64_t>(static_cast<int64_t>(native_min_tile_elements), (numel / tiles + 63) / 64 * 64);
}

std::optional<Policy> builtin_policy(const std::string& name) {
  Policy p;
  p.name = name;
  if (name == "default") return p;
  if (name == "aggressive") {
    p.hot_threshold = 2;
    p.max_segment_length = 1024;
    p.min_fusible_ops = 1;
    p.min_group_elements = 0;
    p.expected_repeats = 100000;  // above the default: compiles tier 2 sooner
    return p;
  }
  if (name == "conservative") {
    p.hot_threshold = 20;
    p.max_segment_length = 64;
    p.min_fusible_ops = 4;
    p.min_group_elements = 262144;
    p.expected_repeats = 20;
    p.tier = Tier::kInstant;
    return p;
  }
  if (name == "never") {
    p.hot_threshold = 1000000;
    p.expected_repeats = 0;
    return p;
  }
  return std::nullopt;
}

std::vector<std::string> builtin_policy_names() {
  return {"default", "aggressive", "conservative", "never"};
}

}  // namespace neuron::fusion
