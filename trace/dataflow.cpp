#include "trace/dataflow.h"

#include <algorithm>

namespace neuron::trace {

void DataflowLinker::link(uint64_t seq, std::span<const uint64_t> inputs,
                          std::span<const uint64_t> outputs, std::vector<uint32_t>& codes) {
  codes.clear();
  uint32_t slot = 0;
  for (uint64_t storage : inputs) {
    if (storage == 0) {
      codes.push_back(kLinkNoTensor);
      ++slot;
      continue;
    }
    auto [it, inserted] = last_.try_emplace(storage, 0);
    uint32_t code = kLinkNew;
    if (!inserted) {
      const uint64_t distance = seq - (it->second >> 12);
      const uint32_t prev = static_cast<uint32_t>(it->second & 0xFFF);
      if (distance <= kLinkMaxDistance && prev <= kLinkMaxSlot)
        code = 1 + static_cast<uint32_t>(distance << 11 | prev);
    }
    codes.push_back(code);
    it->second = seq << 12 | std::min<uint32_t>(slot, 0xFFF);
    ++slot;
  }
  for (uint64_t storage : outputs) {
    codes.push_back(storage == 0 ? kLinkOutputUndefined : kLinkOutput);
    if (storage != 0) last_[storage] = seq << 12 | std::min<uint32_t>(slot, 0xFFF);
    ++slot;
  }
}

void append_dataflow_events(const Event& base, const std::vector<uint32_t>& codes,
                            std::vector<Event>& out) {
  const size_t n = codes.empty() ? 1 : (codes.size() + kLinksPerEvent - 1) / kLinksPerEvent;
  for (size_t k = 0; k < n; ++k) {
    Event e = base;
    e.kind = static_cast<uint8_t>(EventKind::kOpDataflow);
    e.duration_ns = 0;
    e.flags = static_cast<uint16_t>(k);
    e.value = e.aux = 0;
    for (int i = 0; i < kLinksPerEvent; ++i) {
      const size_t at = k * kLinksPerEvent + static_cast<size_t>(i);
      const uint64_t code = at < codes.size() ? codes[at] : kLinkEnd;
      (i < 3 ? e.value : e.aux) |= code << (21 * (i % 3));
    }
    out.push_back(e);
  }
}

namespace {

int64_t last_dim(const TensorMeta& m) { return m.ndim ? m.sizes[m.ndim - 1] : 1; }

int64_t inner_volume(const TensorMeta& m) {  // a weight's elements per output channel
  int64_t v = 1;
  for (int i = 1; i < m.ndim; ++i) v *= m.sizes[i];
  return v;
}

}  // namespace

uint64_t matmul_flops(std::string_view name, const std::vector<TensorMeta>& in,
                      const std::vector<TensorMeta>& out) {
  if (out.empty() || !out[0].defined) return 0;
  const int64_t n_out = out[0].numel();
  int64_t k = 0;
  if ((name == "aten::mm" || name == "aten::bmm") && in.size() >= 2) k = last_dim(in[0]);
  else if ((name == "aten::addmm" || name == "aten::baddbmm") && in.size() >= 3) k = last_dim(in[1]);
  else if (name == "aten::convolution" && in.size() >= 2) k = inner_volume(in[1]);
  else if (name == "aten::convolution_backward" && in.size() >= 3)
    return static_cast<uint64_t>(2 * 2 * in[0].numel() * inner_volume(in[2]));  // two convs
  return k > 0 ? static_cast<uint64_t>(2 * n_out * k) : 0;
}

}  // namespace neuron::trace
