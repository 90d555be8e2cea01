// The engine's side of the stream trial (fusion/stream_guard.h decides): the guard's
// calls from the recording path, its counters and its verdicts in the log and the trace.
#include <string>

#include "engine/adaptive_registry.h"
#include "engine/stream_state.h"
#include "trace/counters.h"
#include "trace/log.h"

namespace neuron::engine {
namespace {

trace::Counter g_stream_trials{"stream_trials"}, g_stream_unrecorded{"stream_trial_unrecorded"},
    g_stream_recorded{"stream_trial_recorded"};

// Counts and reports a trial that started or ended during the guard's call.
uint64_t noted(StreamState& ss, c10::DeviceIndex core, uint32_t trials_before,
               uint32_t report_trial_before, uint64_t unrecorded) {
  const fusion::StreamGuard& g = ss.stream_guard;
  if (g.trials() != trials_before) ++g_stream_trials;
  const fusion::StreamTrialReport& r = g.last_report();
  if (r.trial != report_trial_before && r.verdict != fusion::StreamVerdict::kNone) {
    ++(r.verdict == fusion::StreamVerdict::kSettle ? g_stream_unrecorded : g_stream_recorded);
    const std::string text = std::string("stream trial ") + std::to_string(r.trial) + " on core " +
                             std::to_string(core) + ": " + fusion::stream_verdict_name(r.verdict) +
                             " (unrecorded/recorded " + std::to_string(r.ratio) + " over " +
                             std::to_string(r.pairs) + " pairs)";
    trace::log(trace::LogLevel::kInfo, text);
    fallback_event(r.verdict == fusion::StreamVerdict::kSettle
                       ? "stream trial: unrecorded stretches were faster; the stream passes its ops unrecorded for a period"
                       : "stream trial: recording kept",
                   static_cast<uint8_t>(core));
  }
  return unrecorded;
}

}  // namespace

uint64_t stream_trial_recorded_op(StreamState& ss, c10::DeviceIndex core) {
  fusion::StreamGuard& g = ss.stream_guard;
  const uint32_t trials = g.trials(), reported = g.last_report().trial;
  const uint64_t unrecorded = g.on_recorded_op();
  if (unrecorded == 0 && g.trials() == trials) return 0;
  return noted(ss, core, trials, reported, unrecorded);
}

uint64_t stream_trial_unrecorded_done(StreamState& ss, c10::DeviceIndex core) {
  fusion::StreamGuard& g = ss.stream_guard;
  const uint32_t trials = g.trials(), reported = g.last_report().trial;
  return noted(ss, core, trials, reported, g.on_unrecorded_done());
}

}  // namespace neuron::engine
