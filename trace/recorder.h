// Trace recording: events go to a per-thread buffer on the hot path and a background
// thread compresses and writes them. When recording is off, emit() is one relaxed load.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "trace/event.h"

namespace neuron::trace {

inline constexpr uint32_t kFormatVersion = 1;
inline constexpr char kMagic[8] = {'N', 'E', 'U', 'R', 'O', 'N', 'T', 'R'};

// Chunk types of the file format.
enum class ChunkType : uint32_t { kMetadata = 1, kStrings = 2, kEvents = 3, kEnd = 4 };

class Recorder {
 public:
  static Recorder& instance();

  // Starts writing to path; metadata_json is stored first (mode, policy, versions).
  // Returns false with error set if the file cannot be opened or a recording is running.
  bool start(const std::string& path, const std::string& metadata_json, std::string& error);
  // Flushes everything and closes the file. Returns events written.
  uint64_t stop();
  bool active() const { return active_.load(std::memory_order_relaxed); }
  std::string path() const;

  uint64_t now_ns() const;
  void emit(const Event& event);
  // An event that ends now and lasted duration_ns (0: an instant): its start is clamped
  // to the recording's (a duration longer than the recording so far starts at 0).
  void emit_ended(EventKind kind, uint64_t value, uint64_t aux = 0, uint64_t duration_ns = 0, uint8_t core = 0);
  // Names shown by viewers: op ids, string ids (causes, reasons, stacks), thread ids.
  void name_op(uint32_t id, const std::string& name);
  uint32_t intern_string(const std::string& text);
  // The calling thread's recorder id, named on first use.
  uint16_t thread_id(const char* role);

  uint64_t events_written() const { return events_written_.load(); }
  uint64_t bytes_written() const { return bytes_written_.load(); }

 private:
  Recorder() = default;
  std::atomic<bool> active_{false};
  std::atomic<uint64_t> events_written_{0};
  std::atomic<uint64_t> bytes_written_{0};
};

// Cheap guard for hot paths.
inline bool recording() { return Recorder::instance().active(); }

}  // namespace neuron::trace
