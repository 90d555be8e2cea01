// The `neuron` logger. Torch-free so that engine code reaches spdlog without mixing
// torch's bundled fmt with the system one.
#pragma once

#include <string>
#include <string_view>

namespace neuron::trace {

enum class LogLevel { kTrace, kDebug, kInfo, kWarn, kError, kCritical, kOff };

// Parses an spdlog level name; returns false for anything else.
bool parse_log_level(std::string_view text, LogLevel& out);
void set_log_level(LogLevel level);
LogLevel log_level();
bool log_enabled(LogLevel level);
void log(LogLevel level, std::string_view message);

}  // namespace neuron::trace
