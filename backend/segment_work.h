// A fused segment: the ops of one recorded segment run as one work item following a
// fusion program. Tile groups run pointwise ops tile by tile (intermediates stay in cache,
// dead ones never reach device memory); extern steps run the op's own kernel.
#pragma once

#include <atomic>
#include <memory>
#include <vector>

#include "backend/native_group.h"
#include "backend/op_work.h"
#include "fusion/planner.h"

namespace neuron::backend {

// Test hook: the next n tile groups throw before computing (fault injection).
void inject_tile_group_failures(int n);

class SegmentWork final : public WorkItem {
 public:
  void run() override;
  std::string describe() const override;
  void finish(std::unique_ptr<WorkItem> self) override;  // its ops go back to the pool

  std::shared_ptr<const fusion::Program> program;
  // Indexed by position in the segment; null where the op was queued by another item
  // (released extern ops, groups launched before the cut): those steps are skipped.
  std::vector<std::unique_ptr<OpWork>> ops;
  // Per step: the tile group's tier-2 state (null for extern steps or without tier 2).
  std::vector<std::shared_ptr<NativeGroup>> natives;
  uint64_t key = 0;
  uint64_t seq = 0;  // first op's sequence number when traced
  uint8_t core = 0;
  uint16_t stream = 0;
  // Bumped when a tile group failed and its ops were rerun one by one.
  std::shared_ptr<std::atomic<uint64_t>> failures;

 private:
  void run_group(const fusion::Step& step);
  void run_foreach(const fusion::Step& step);
};

}  // namespace neuron::backend
