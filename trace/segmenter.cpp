#include "trace/segmenter.h"

#include <algorithm>
#include <unordered_map>

#include "trace/hash.h"

namespace neuron::trace {
namespace {

constexpr int64_t kProduced = 1, kExternal = 2, kNoTensor = 3, kAlive = 4, kDead = 5;

// Storage identity -> small value, open addressing, reused across segments on a thread:
// keying a segment allocates nothing once the table has grown to the longest segment.
class IdTable {
 public:
  void reset(size_t expected) {
    size_t want = 16;
    while (want < expected * 2) want *= 2;
    if (want > slots_.size()) slots_.assign(want, Slot{});
    ++generation_;
    if (generation_ == 0) {  // wrapped: stale stamps could look current
      for (auto& slot : slots_) slot.generation = 0;
      generation_ = 1;
    }
    count_ = 0;
  }
  // The slot of key, inserting value if it is new (inserted tells which).
  int64_t& find_or_insert(uint64_t key, int64_t value, bool& inserted) {
    const size_t mask = slots_.size() - 1;
    for (size_t i = mix(key) & mask;; i = (i + 1) & mask) {
      Slot& slot = slots_[i];
      if (slot.generation != generation_) {
        slot = {key, value, generation_};
        ++count_;
        inserted = true;
        return slot.value;
      }
      if (slot.key == key) {
        inserted = false;
        return slot.value;
      }
    }
  }
  const int64_t* find(uint64_t key) const {
    const size_t mask = slots_.size() - 1;
    for (size_t i = mix(key) & mask;; i = (i + 1) & mask) {
      const Slot& slot = slots_[i];
      if (slot.generation != generation_) return nullptr;
      if (slot.key == key) return &slot.value;
    }
  }
  size_t count() const { return count_; }

 private:
  struct Slot {
    uint64_t key = 0;
    int64_t value = 0;
    uint32_t generation = 0;
  };
  static size_t mix(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return static_cast<size_t>(k);
  }
  std::vector<Slot> slots_;
  uint32_t generation_ = 0;
  size_t count_ = 0;
};

}  // namespace

void make_segment_into(const std::vector<SegmentOp>& ops, CutReason reason,
                       const std::vector<bool>& alive, Segment& s) {
  s.length = static_cast<uint32_t>(ops.size());
  s.first_seq = ops.empty() ? 0 : ops.front().seq;
  s.reason = reason;
  size_t n_inputs = 0, n_outputs = 0;
  for (const SegmentOp& op : ops) {
    n_inputs += op.inputs.size();
    n_outputs += op.outputs.size();
  }
  // storage -> (op index << 32 | output index) for values produced inside the segment;
  // storage -> first-seen external index (equal numbers mean aliasing)
  thread_local IdTable produced, external;
  produced.reset(n_outputs);
  external.reset(n_inputs);
  auto& w = s.words;
  w.clear();
  w.reserve(ops.size() * 2 + n_inputs * 3 + n_outputs);
  thread_local std::vector<size_t> op_at;  // where each op's signature word is
  op_at.clear();
  for (size_t i = 0; i < ops.size(); ++i) {
    const SegmentOp& op = ops[i];
    op_at.push_back(w.size());
    w.push_back(static_cast<int64_t>(op.signature));
    w.push_back(static_cast<int64_t>(op.inputs.size()));
    for (uint64_t storage : op.inputs) {
      if (storage == 0) {
        w.push_back(kNoTensor);
        continue;
      }
      if (const int64_t* p = produced.find(storage)) {
        w.push_back(kProduced);
        w.push_back(*p >> 32);
        w.push_back(*p & 0xffffffff);
        continue;
      }
      bool inserted;
      const int64_t index = external.find_or_insert(storage, static_cast<int64_t>(external.count()), inserted);
      w.push_back(kExternal);
      w.push_back(index);
    }
    for (size_t k = 0; k < op.outputs.size(); ++k)
      if (op.outputs[k] != 0) {
        bool inserted;
        produced.find_or_insert(op.outputs[k], 0, inserted) = static_cast<int64_t>(i) << 32 | static_cast<int64_t>(k);
      }
  }
  size_t out_index = 0;
  for (const SegmentOp& op : ops)
    for (size_t k = 0; k < op.outputs.size(); ++k, ++out_index)
      w.push_back(out_index < alive.size() && !alive[out_index] ? kDead : kAlive);
  s.key = hash_words(w.data(), w.size());
  thread_local std::vector<int64_t> family;
  family.assign(w.begin(), w.end());
  for (size_t i = 0; i < ops.size(); ++i) family[op_at[i]] = static_cast<int64_t>(ops[i].op);
  s.family = hash_words(family.data(), family.size(), /*seed=*/0xfa);
}

uint64_t op_kind(std::string_view name) {
  const uint64_t h = hash_bytes(name.data(), name.size(), /*seed=*/0x6b1d);
  return h == 0 ? 1 : h;
}

Segment make_segment(const std::vector<SegmentOp>& ops, CutReason reason,
                     const std::vector<bool>& alive) {
  Segment s;
  make_segment_into(ops, reason, alive, s);
  return s;
}

std::vector<uint64_t> op_signatures(const std::vector<int64_t>& words, uint32_t length) {
  std::vector<uint64_t> signatures;
  size_t w = 0;
  for (uint32_t i = 0; i < length && w < words.size(); ++i) {
    signatures.push_back(static_cast<uint64_t>(words[w]));
    const int64_t n_inputs = words[w + 1];
    w += 2;
    for (int64_t k = 0; k < n_inputs; ++k) {
      const int64_t tag = words[w];  // then the producer's op and output, or the external index
      w += tag == kProduced ? 3 : tag == kExternal ? 2 : 1;
    }
  }
  return signatures;
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
  if ((h & policy_.rolling_mask) != 0) return false;
  if (op.whole_run && policy_.keep_runs_whole) {
    deferred_cut_ = true;  // cut_before the run's next other op
    return false;
  }
  return true;
}

bool Segmenter::cut_before(const SegmentOp& op) const {
  if (after_cut_op_ && !ops_.empty() && !op.barrier && !is_cut_after(op.op)) return true;
  if (deferred_cut_ && !ops_.empty() && !op.barrier && !op.whole_run) return true;
  return policy_.use_rolling_cut && !before_start_.empty() &&
         before_start_.size() == policy_.rolling_window &&
         ops_.size() >= std::max<size_t>({2 * size_t{policy_.rolling_window}, 2, policy_.loop_min_ops}) &&
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
  recent_.push_back(policy_.rolling_shapes || op.kind == 0 ? op.signature : op.kind);
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
  Segment s;
  if (!flush_into(reason, alive, s)) return std::nullopt;
  return s;
}

bool Segmenter::flush_into(CutReason reason, const std::vector<bool>& alive, Segment& out) {
  after_cut_op_ = false;
  deferred_cut_ = false;
  if (ops_.empty()) return false;
  make_segment_into(ops_, reason, alive, out);
  ops_.clear();
  return true;
}

std::vector<int64_t> Segmenter::open_op_words() const {
  Segment s = make_segment(ops_, CutReason::kFlush, {});
  size_t outputs = 0;
  for (const auto& op : ops_) outputs += op.outputs.size();
  s.words.resize(s.words.size() - outputs);
  return std::move(s.words);
}

void Segmenter::open_outputs_into(std::vector<uint64_t>& out) const {
  out.clear();
  for (const auto& op : ops_) out.insert(out.end(), op.outputs.begin(), op.outputs.end());
}

}  // namespace neuron::trace
