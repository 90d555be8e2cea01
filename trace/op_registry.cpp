#include "trace/op_registry.h"

#include <deque>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

namespace neuron::trace {
namespace {

struct Table {
  mutable std::shared_mutex mutex;
  std::deque<std::string> names;  // id - 1 -> name; deque keeps string_views stable
  std::unordered_map<std::string_view, OpId> ids;
};

Table& table() {
  static Table* t = new Table();  // leaked: used by worker threads until process exit
  return *t;
}

}  // namespace

OpRegistry& OpRegistry::instance() {
  static OpRegistry registry;
  return registry;
}

OpId OpRegistry::intern(std::string_view name) {
  Table& t = table();
  {
    std::shared_lock lock(t.mutex);
    auto it = t.ids.find(name);
    if (it != t.ids.end()) return it->second;
  }
  std::unique_lock lock(t.mutex);
  auto it = t.ids.find(name);
  if (it != t.ids.end()) return it->second;
  t.names.emplace_back(name);
  OpId id = static_cast<OpId>(t.names.size());
  t.ids.emplace(t.names.back(), id);
  return id;
}

std::string OpRegistry::name(OpId id) const {
  Table& t = table();
  std::shared_lock lock(t.mutex);
  if (id == 0 || id > t.names.size()) return "<unknown op>";
  return t.names[id - 1];
}

size_t OpRegistry::size() const {
  Table& t = table();
  std::shared_lock lock(t.mutex);
  return t.names.size();
}

}  // namespace neuron::trace
