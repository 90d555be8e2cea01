// Helpers shared by the tier-2 group code: trace notes, the clock, device addresses,
// scalar arguments and bitwise comparison.
#include "backend/native_group_detail.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "trace/recorder.h"

namespace neuron::backend::detail {

void emit_tier2_event(trace::EventKind kind, uint64_t key, uint64_t aux, uint64_t duration,
                      const std::string& reason) {
  if (!trace::recording()) return;
  auto& rec = trace::Recorder::instance();
  rec.emit_ended(kind, reason.empty() ? key : rec.intern_string(reason), aux, duration);
}

void tier2_note(uint64_t key, const std::string& what) {
  emit_tier2_event(trace::EventKind::kFallback, key, 0, 0, "tier 2: " + what);
}

char* data_of(const DeviceBuffer& storage, const trace::TensorMeta& m) {
  return static_cast<char*>(storage.data) +
         m.storage_offset * static_cast<int64_t>(c10::elementSize(static_cast<c10::ScalarType>(m.dtype)));
}

double scalar_value(const c10::IValue& v) {
  if (v.isDouble()) return v.toDouble();
  if (v.isInt()) return static_cast<double>(v.toInt());
  if (v.isBool()) return v.toBool() ? 1.0 : 0.0;
  return v.toScalar().toDouble();
}

bool close_value(const char* a, const char* b, fusion::ElemType type, double rtol, double atol) {
  if (same_value(a, b, type)) return true;
  double x, y;
  if (type == fusion::ElemType::kFloat32) {
    float fx, fy;
    std::memcpy(&fx, a, 4);
    std::memcpy(&fy, b, 4);
    x = fx, y = fy;
  } else {
    std::memcpy(&x, a, 8);
    std::memcpy(&y, b, 8);
  }
  if (!std::isfinite(x) || !std::isfinite(y)) return false;
  return std::abs(x - y) <= atol + rtol * std::abs(x);
}

bool same_value(const char* a, const char* b, fusion::ElemType type) {
  if (type == fusion::ElemType::kFloat32) {
    float x, y;
    std::memcpy(&x, a, 4);
    std::memcpy(&y, b, 4);
    return std::memcmp(a, b, 4) == 0 || (std::isnan(x) && std::isnan(y));
  }
  double x, y;
  std::memcpy(&x, a, 8);
  std::memcpy(&y, b, 8);
  return std::memcmp(a, b, 8) == 0 || (std::isnan(x) && std::isnan(y));
}

// The kernel element type of a group's dtype (float32 and float64 have kernels).
bool element_type(c10::ScalarType dtype, fusion::ElemType& type, std::string& why_not) {
  if (dtype == c10::kFloat)
    type = fusion::ElemType::kFloat32;
  else if (dtype == c10::kDouble)
    type = fusion::ElemType::kFloat64;
  else
    return why_not = std::string("element type ") + c10::toString(dtype) + " (float32 and float64 only)", false;
  return true;
}

}  // namespace neuron::backend::detail
