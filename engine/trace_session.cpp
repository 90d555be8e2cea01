// A trace recording: its start (metadata: mode, policy, versions) and stop, and the host
// waits it shows (Sync events, with the Python stack of each cause's first one).
#include <torch/version.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <mutex>
#include <string>
#include <unordered_set>

#include "engine/engine.h"
#include "engine/recording.h"
#include "engine/trace_events.h"
#include "fusion/policy.h"

namespace neuron::engine {
namespace {

using trace::Event;
using trace::EventKind;
using trace::Recorder;

std::mutex g_seen_mutex;
std::unordered_set<std::string> g_seen_causes;  // sync causes seen in this recording
std::atomic<std::string (*)()> g_stack_capture{nullptr};

}  // namespace

void set_stack_capture(std::string (*capture)()) { g_stack_capture.store(capture); }

SyncScope::SyncScope(c10::DeviceIndex core, const char* cause) : core_(core), cause_(cause) {
  flush_windows(core);
  if (!observing()) return;
  if (trace::recording()) start_ns_ = Recorder::instance().now_ns();
}

SyncScope::~SyncScope() {
  if (start_ns_ == 0 || !trace::recording()) return;
  auto& rec = Recorder::instance();
  Event e;
  e.time_ns = start_ns_;
  e.duration_ns = rec.now_ns() - start_ns_;
  e.kind = static_cast<uint8_t>(EventKind::kSync);
  e.core = static_cast<uint8_t>(core_);
  e.value = rec.intern_string(cause_);
  // The Python stack of the first sync with this cause in this recording.
  bool first = false;
  {
    std::lock_guard lock(g_seen_mutex);
    first = g_seen_causes.insert(cause_).second;
  }
  if (first) {
    if (auto capture = g_stack_capture.load()) {
      std::string stack = capture();
      if (!stack.empty()) e.aux = rec.intern_string(stack);
    }
  }
  rec.emit(e);
  emit_counters(core_, rec.now_ns());
}

void start_trace(const std::string& path, const std::string& user_json) {
  const Config& c = config();
  std::string meta = "{\"format_version\":" + std::to_string(trace::kFormatVersion) +
                     ",\"engine\":\"neuron-eager 0.1.0\",\"torch\":\"" TORCH_VERSION "\"" +
                     ",\"mode\":\"" + mode_name(mode()) + "\",\"cores\":" +
                     std::to_string(c.cores) + ",\"hbm_bytes\":" + std::to_string(c.hbm_bytes) +
                     ",\"pid\":" + std::to_string(getpid()) +
                     ",\"policy\":" + fusion::policy_json(active_policy()) +
                     ",\"segment_cache_keys_at_start\":" + std::to_string(trace_cache().size());
  // The caller's fields join ours: {"a":1} -> ,"a":1
  std::string user = user_json;
  while (!user.empty() && std::isspace(static_cast<unsigned char>(user.front()))) user.erase(0, 1);
  while (!user.empty() && std::isspace(static_cast<unsigned char>(user.back()))) user.pop_back();
  if (user.size() > 2 && user.front() == '{' && user.back() == '}')
    meta += "," + user.substr(1, user.size() - 2);
  meta += "}";
  {
    std::lock_guard lock(g_seen_mutex);
    g_seen_causes.clear();
  }
  restart_dataflow_links();  // dataflow links start afresh in each recording
  std::string error;
  Recorder::instance().thread_id("host");
  TORCH_CHECK(Recorder::instance().start(path, meta, error), "neuron: ", error);
}

uint64_t stop_trace() {
  // Close open segments so their keys reach the file.
  flush_all_windows();
  return Recorder::instance().stop();
}

}  // namespace neuron::engine
