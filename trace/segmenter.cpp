#include "trace/segmenter.h"

#include <algorithm>
#include <unordered_map>

#include "trace/hash.h"

namespace neuron::trace {
namespace {

constexpr int64_t kProduced = 1, kExternal = 2, kNoTensor = 3, kAlive = 4, kDead = 5;

}  // namespace

Segment make_segment(const std::vector<SegmentOp>& ops, CutReason reason,
                     const std::vector<bool>& alive) {
  Segment s;
  s.length = static_cast<uint32_t>(ops.size());
  s.first_seq = ops.empty() ? 0 : ops.front().seq;
  s.reason = reason;
  // storage -> (op index, output index) for values produced inside the segment
  std::unordered_map<uint64_t, std::pair<int64_t, int64_t>> produced;
  std::unordered_map<uint64_t, int64_t> external;  // storage -> first-seen external index
  auto& w = s.words;
  w.reserve(ops.size() * 8);
  for (size_t i = 0; i < ops.size(); ++i) {
    const SegmentOp& op = ops[i];
    w.push_back(static_cast<int64_t>(op.signature));
    w.push_back(static_cast<int64_t>(op.inputs.size()));
    for (uint64_t storage : op.inputs) {
      if (storage == 0) {
        w.push_back(kNoTensor);
        continue;
      }
      auto p = produced.find(storage);
      if (p != produced.end()) {
        w.push_back(kProduced);
        w.push_back(p->second.first);
        w.push_back(p->second.second);
        continue;
      }
      // External inputs are numbered by first use: equal numbers mean aliasing.
      auto [e, inserted] = external.emplace(storage, static_cast<int64_t>(external.size()));
      w.push_back(kExternal);
      w.push_back(e->second);
    }
    for (size_t k = 0; k < op.outputs.size(); ++k)
      if (op.outputs[k] != 0)
        produced[op.outputs[k]] = {static_cast<int64_t>(i), static_cast<int64_t>(k)};
  }
  size_t out_index = 0;
  for (const SegmentOp& op : ops)
    for (size_t k = 0; k < op.outputs.size(); ++k, ++out_index)
      w.push_back(out_index < alive.size() && !alive[out_index] ? kDead : kAlive);
  s.key = hash_words(w.data(), w.size());
  return s;
}

Segmenter::Segmenter(SegmentPolicy policy) : policy_(std::move(policy)) {
  ops_.reserve(policy_.max_length);
}

bool Segmenter::is_cut_after(OpId op) const {
  return std::find(policy_.cut_after.begin(), policy_.cut_after.end(), op) != policy_.cut_after.end();
}

bool Segmenter::content_cut(const SegmentOp& op) {
  after_cut_op_ = is_cut_after(op.op);  // the cut comes before the next other op
  if (!policy_.use_rolling_cut || recent_.size() < policy_.rolling_window) return false;
  const uint64_t h =
      hash_bytes(recent_.data(), recent_.size() * sizeof(uint64_t), /*seed=*/0x5e9);
  return (h & policy_.rolling_mask) == 0;
}

bool Segmenter::cut_before(const SegmentOp& op) const {
  if (after_cut_op_ && !ops_.empty() && !op.barrier && !is_cut_after(op.op)) return true;
  return policy_.use_rolling_cut && !before_start_.empty() &&
         before_start_.size() == policy_.rolling_window &&
         ops_.size() >= std::max<size_t>({2 * size_t{policy_.rolling_window}, 2, policy_.max_length / 2}) &&
         op.signature == ops_.front().signature && recent_ == before_start_;
}

std::optional<CutReason> Segmenter::add(const SegmentOp& op) {
  if (op.barrier) {
    recent_.clear();
    before_start_.clear();
    return CutReason::kBarrier;
  }
  if (ops_.empty()) before_start_ = recent_;
  ops_.push_back(op);
  recent_.push_back(op.signature);
  if (recent_.size() > policy_.rolling_window) recent_.erase(recent_.begin());
  if (content_cut(op)) return CutReason::kContent;
  if (ops_.size() >= policy_.max_length) return CutReason::kMaxLength;
  return std::nullopt;
}

void Segmenter::push(const SegmentOp& op, std::vector<Segment>& closed) {
  if (cut_before(op))
    if (auto s = flush(CutReason::kContent)) closed.push_back(std::move(*s));
  if (auto reason = add(op))
    if (auto s = flush(*reason)) closed.push_back(std::move(*s));
}

std::optional<Segment> Segmenter::flush(CutReason reason, const std::vector<bool>& alive) {
  after_cut_op_ = false;
  if (ops_.empty()) return std::nullopt;
  Segment s = make_segment(ops_, reason, alive);
  ops_.clear();
  return s;
}

std::vector<int64_t> Segmenter::open_op_words() const {
  Segment s = make_segment(ops_, CutReason::kFlush, {});
  size_t outputs = 0;
  for (const auto& op : ops_) outputs += op.outputs.size();
  s.words.resize(s.words.size() - outputs);
  return std::move(s.words);
}

std::vector<uint64_t> Segmenter::open_outputs() const {
  std::vector<uint64_t> out;
  for (const auto& op : ops_) out.insert(out.end(), op.outputs.begin(), op.outputs.end());
  return out;
}

}  // namespace neuron::trace
