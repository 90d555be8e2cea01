// Named process-wide counters, one mechanism for every module's statistics: a Counter
// registers itself under its name when constructed (at static initialisation), so
// neuron_eager.counters() lists every one and reset_counters() zeroes them all, with no
// list kept in step by hand. (The per-op dispatch counters stay in the engine's own
// cache-line-padded block: they are bumped on every op.)
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace neuron::trace {

class Counter {
 public:
  explicit Counter(const char* name);
  Counter(const Counter&) = delete;
  Counter& operator=(const Counter&) = delete;

  uint64_t fetch_add(uint64_t n, std::memory_order order = std::memory_order_relaxed) {
    return value_.fetch_add(n, order);
  }
  Counter& operator++() {
    value_.fetch_add(1, std::memory_order_relaxed);
    return *this;
  }
  Counter& operator+=(uint64_t n) {
    value_.fetch_add(n, std::memory_order_relaxed);
    return *this;
  }
  Counter& operator-=(uint64_t n) {
    value_.fetch_sub(n, std::memory_order_relaxed);
    return *this;
  }
  uint64_t load() const { return value_.load(std::memory_order_relaxed); }
  operator uint64_t() const { return load(); }  // NOLINT: reads like the atomic it replaced
  void reset() { value_.store(0, std::memory_order_relaxed); }
  const char* name() const { return name_; }

 private:
  const char* name_;
  std::atomic<uint64_t> value_{0};
};

// Every registered counter's name and value, in registration order.
std::vector<std::pair<std::string, uint64_t>> counter_values();
// Zeroes every registered counter.
void reset_registered_counters();

}  // namespace neuron::trace
