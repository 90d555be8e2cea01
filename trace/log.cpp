#include "trace/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace neuron::trace {
namespace {

spdlog::logger& logger() {
  static std::shared_ptr<spdlog::logger> l = [] {
    auto existing = spdlog::get("neuron");
    if (existing) return existing;
    auto created = spdlog::stderr_color_mt("neuron");
    created->set_level(spdlog::level::warn);
    created->set_pattern("[neuron %l] %v");
    return created;
  }();
  return *l;
}

spdlog::level::level_enum to_spdlog(LogLevel level) {
  return static_cast<spdlog::level::level_enum>(static_cast<int>(level));
}

}  // namespace

bool parse_log_level(std::string_view text, LogLevel& out) {
  static constexpr std::pair<std::string_view, LogLevel> kNames[] = {
      {"trace", LogLevel::kTrace}, {"debug", LogLevel::kDebug}, {"info", LogLevel::kInfo},
      {"warn", LogLevel::kWarn},   {"warning", LogLevel::kWarn}, {"error", LogLevel::kError},
      {"critical", LogLevel::kCritical}, {"off", LogLevel::kOff}};
  for (auto& [name, level] : kNames) {
    if (text == name) {
      out = level;
      return true;
    }
  }
  return false;
}

void set_log_level(LogLevel level) { logger().set_level(to_spdlog(level)); }

LogLevel log_level() { return static_cast<LogLevel>(static_cast<int>(logger().level())); }

bool log_enabled(LogLevel level) { return logger().should_log(to_spdlog(level)); }

void log(LogLevel level, std::string_view message) {
  logger().log(to_spdlog(level), "{}", message);
}

}  // namespace neuron::trace
