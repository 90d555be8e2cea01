// Environment configuration, parsed once at import. Torch-free: every bad value becomes
// one message naming the variable, the value, and what is allowed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace neuron::engine {

enum class Mode { kEager, kAdaptive };

struct Config {
  Mode mode = Mode::kEager;
  bool launch_blocking = false;
  int cores = 2;
  size_t hbm_bytes = size_t{8} << 30;  // 8 GiB per core
  std::string log_level = "warn";
  int worker_threads = 0;  // intra-op threads for large work items; 0: CPU eager's count
  int64_t sync_yield_us = 20000;  // how long a waiting host thread yields before it sleeps (see config.cpp)
  bool pin_workers = true;        // each worker team thread on its own CPU
  int local_rank = -1;  // torchrun's LOCAL_RANK; -1 when unset (or not a number)
  std::string trace_path;
  std::string policy_path;
  bool fast_numerics = false;  // NEURON_NUMERICS=fast: every policy's numerics default
  std::string cache_dir;
  uint64_t cache_max_bytes = 0;  // NEURON_CACHE_MAX_BYTES; 0: fusion's default (1 GiB)
  uint64_t compile_timeout_ms = 0;  // NEURON_COMPILE_TIMEOUT_S; 0: fusion's default (300 s)
  std::string cxx;  // tier-2 compiler (NEURON_CXX)
};

// Reads NEURON_* from the environment. On a bad value returns std::nullopt and sets error.
std::optional<Config> config_from_env(std::string& error);

// NEURON_TRACE's path for this process: {rank} becomes the RANK variable (0 when unset),
// {pid} the process id; in a job of several ranks (WORLD_SIZE > 1) a path that names no
// {rank} gets ".rank<N>" before its extension, so ranks never write one file.
std::string trace_path_for_process(const std::string& path, const std::optional<std::string>& rank,
                                   const std::optional<std::string>& world_size);

const char* mode_name(Mode mode);
// Parses "eager"/"adaptive"; false for anything else.
bool parse_mode(const std::string& text, Mode& out);
// Parses a byte count: digits with an optional K/M/G/T suffix (KiB, MiB... or KB... all
// binary). False for anything else.
bool parse_bytes(const std::string& text, size_t& out);

}  // namespace neuron::engine
