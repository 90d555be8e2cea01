// The op stream's dataflow in a few bits per tensor slot, written as OpDataflow events, so
// that offline replay can rebuild segment keys for cut points other than the recorded ones.
// Each input slot links to the most recent earlier slot (same stream) that touched the same
// storage; following links recovers storage identity without storing any address.
#pragma once

#include <cstdint>
#include <string_view>
#include <unordered_map>
#include <span>
#include <vector>

#include "trace/event.h"
#include "trace/op_record.h"

namespace neuron::trace {

// A slot's 21-bit link code. Inputs: kLinkNew (a storage not touched within reach),
// kLinkNoTensor (no device tensor), or 1 + (distance << 11 | slot): the slot `slot`
// (inputs first, then outputs) of the op `distance` seqs back (0: this op) touched it last.
// Outputs: kLinkOutput (a fresh storage) or kLinkOutputUndefined. kLinkEnd pads.
inline constexpr uint32_t kLinkNew = 0;
inline constexpr uint32_t kLinkOutputUndefined = 0x1FFFFC;
inline constexpr uint32_t kLinkOutput = 0x1FFFFD;
inline constexpr uint32_t kLinkNoTensor = 0x1FFFFE;
inline constexpr uint32_t kLinkEnd = 0x1FFFFF;
inline constexpr uint64_t kLinkMaxDistance = 1023;
inline constexpr uint32_t kLinkMaxSlot = 2047;
inline constexpr int kLinksPerEvent = 6;          // three in value, three in aux
inline constexpr uint16_t kDataflowFlops = 0x8000;  // flags: value = the op's FLOPs instead

struct Link {
  uint64_t distance = 0;
  uint32_t slot = 0;
};
inline bool is_link(uint32_t code) { return code != kLinkNew && code < kLinkOutputUndefined; }
inline Link decode_link(uint32_t code) { return {(code - 1) >> 11, (code - 1) & 0x7FF}; }

class DataflowLinker {
 public:
  // Link codes of one op: its input storages (0: none) then its fresh outputs (0: undefined).
  void link(uint64_t seq, std::span<const uint64_t> inputs, std::span<const uint64_t> outputs,
            std::vector<uint32_t>& codes);
  void link(uint64_t seq, const std::vector<uint64_t>& inputs,
            const std::vector<uint64_t>& outputs, std::vector<uint32_t>& codes) {
    link(seq, std::span<const uint64_t>(inputs), std::span<const uint64_t>(outputs), codes);
  }
  void clear() { last_.clear(); }

 private:
  std::unordered_map<uint64_t, uint64_t> last_;  // storage -> seq << 12 | slot
};

// OpDataflow events of one op (base gives time, seq, op, core, stream); flags = event index.
void append_dataflow_events(const Event& base, const std::vector<uint32_t>& codes,
                            std::vector<Event>& out);
// Link code i (0..5) of an OpDataflow event.
inline uint32_t dataflow_code(const Event& e, int i) {
  const uint64_t word = i < 3 ? e.value : e.aux;
  return static_cast<uint32_t>((word >> (21 * (i % 3))) & 0x1FFFFF);
}

// FLOPs of matmul-class ops (mm, addmm, bmm, baddbmm, convolution and its backward), from
// their tensor metas; 0 for anything else (replay's cost model then goes by bytes).
uint64_t matmul_flops(std::string_view op_name, const std::vector<TensorMeta>& inputs,
                      const std::vector<TensorMeta>& outputs);

}  // namespace neuron::trace
