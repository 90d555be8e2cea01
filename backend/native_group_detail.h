// Helpers shared by the tier-2 group code (native_group.cpp: the life cycle;
// native_pointwise.cpp: tile groups; native_foreach.cpp: foreach groups), defined in
// native_group_detail.cpp. Internal to the backend.
#pragma once

#include <cstdint>
#include <string>

#include "backend/op_work.h"
#include "fusion/codegen.h"
#include "trace/clock.h"
#include "trace/event.h"

namespace neuron::backend::detail {

// A trace event about a group's tier 2 (reason, when given, replaces the key as value).
void emit_tier2_event(trace::EventKind kind, uint64_t key, uint64_t aux, uint64_t duration,
                      const std::string& reason = "");
using trace::steady_ns;  // the project's one clock (trace/clock.h)
void tier2_note(uint64_t key, const std::string& what);
char* data_of(const DeviceBuffer& storage, const trace::TensorMeta& m);
double scalar_value(const c10::IValue& v);
// Bit for bit, NaN equal to NaN.
bool same_value(const char* a, const char* b, fusion::ElemType type);
// Fast numerics' trials: |a - b| <= atol + rtol * |a| (NaN equal to NaN, infinities equal
// only to themselves).
bool close_value(const char* a, const char* b, fusion::ElemType type, double rtol, double atol);
// The kernel element type of a group's dtype (float32 and float64 have kernels).
bool element_type(c10::ScalarType dtype, fusion::ElemType& type, std::string& why_not);
void count_tier1_elements(size_t n);

}  // namespace neuron::backend::detail
