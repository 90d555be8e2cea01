// Interned op names: the engine hands out a small integer per schema once, and every
// record, key and trace refers to ops by that id.
#pragma once

#include <string>
#include <string_view>

#include "trace/op_record.h"

namespace neuron::trace {

class OpRegistry {
 public:
  static OpRegistry& instance();
  // Returns the id of name, interning it on first sight. Thread-safe.
  OpId intern(std::string_view name);
  // The name behind id; "<unknown op>" for ids never handed out.
  std::string name(OpId id) const;
  size_t size() const;

 private:
  OpRegistry() = default;
};

}  // namespace neuron::trace
