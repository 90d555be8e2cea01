// The counter registry: every Counter is listed by name once constructed, counts from any
// thread, and one reset zeroes them all.
#include <gtest/gtest.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "trace/counters.h"

using neuron::trace::Counter;

namespace {

uint64_t value_of(const std::string& name) {
  const auto values = neuron::trace::counter_values();
  auto it = std::find_if(values.begin(), values.end(), [&](const auto& v) { return v.first == name; });
  EXPECT_NE(it, values.end()) << name;
  return it == values.end() ? ~uint64_t{0} : it->second;
}

}  // namespace

TEST(Counters, AreListedByNameAndCountFromEveryThread) {
  static Counter a{"test_counter_a"}, b{"test_counter_b"};
  ++a;
  a += 4;
  a -= 2;
  b.fetch_add(7);
  EXPECT_EQ(value_of("test_counter_a"), 3u);
  EXPECT_EQ(value_of("test_counter_b"), 7u);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([] {
      for (int i = 0; i < 10000; ++i) ++b;
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(b.load(), 40007u);
  neuron::trace::reset_registered_counters();
  EXPECT_EQ(value_of("test_counter_a"), 0u);
  EXPECT_EQ(value_of("test_counter_b"), 0u);
}
