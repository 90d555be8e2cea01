// The system C++ compiler as a child process: its identity and one shared-object build,
// its output captured in a log file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace neuron::fusion {

inline constexpr int kProcessTimedOut = -2;

// Runs argv with stdout and stderr sent to log_path; returns the exit status (-1: could
// not start; kProcessTimedOut: still running after timeout_ms (0: no limit), its whole
// process group was killed). outputs: files it writes, removed (with the log) if this
// process exits while it runs.
int run_process(const std::vector<std::string>& argv, const std::string& log_path,
                uint64_t timeout_ms = 0, const std::vector<std::string>& outputs = {});
// Whether a process run_process started (a compiler) is running now: waiting threads then
// sleep instead of yielding (backend/stream.cpp), since a yield hands the core to it.
bool children_running();
// The first line `compiler --version` prints, or "unknown compiler NAME".
std::string compiler_version(const std::string& compiler);
// Builds the shared object out_path from source_path (`compiler flags -shared -fPIC -o
// out_path source_path link_flags`), its output in log_path; the exit status as
// run_process's.
int compile_shared_object(const std::string& compiler, const std::vector<std::string>& flags,
                          const std::vector<std::string>& link_flags,
                          const std::string& source_path, const std::string& out_path,
                          const std::string& log_path, uint64_t timeout_ms = 0);
// The last `lines` lines of text (a compiler's log, for an error message).
std::string last_lines(const std::string& text, int lines);

}  // namespace neuron::fusion
