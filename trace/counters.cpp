#include "trace/counters.h"

#include <mutex>

namespace neuron::trace {
namespace {

struct Registry {
  std::mutex mutex;
  std::vector<Counter*> counters;
};

Registry& registry() {
  static Registry* r = new Registry();  // outlives every static Counter
  return *r;
}

}  // namespace

Counter::Counter(const char* name) : name_(name) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.counters.push_back(this);
}

std::vector<std::pair<std::string, uint64_t>> counter_values() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  std::vector<std::pair<std::string, uint64_t>> out;
  out.reserve(r.counters.size());
  for (const Counter* c : r.counters) out.emplace_back(c->name(), c->load());
  return out;
}

void reset_registered_counters() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  for (Counter* c : r.counters) c->reset();
}

}  // namespace neuron::trace
