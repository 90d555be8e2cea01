#include "fusion/compile_prelude.h"

#include <unistd.h>
#include <xxhash.h>

#include <chrono>
#include <filesystem>
#include <system_error>

#include "fusion/atomic_file.h"
#include "fusion/compiler_process.h"
#include "fusion/native.h"

namespace neuron::fusion {
namespace fs = std::filesystem;

std::string CompilePrelude::include_path() const {
  std::lock_guard lock(mutex_);
  return include_;
}

void CompilePrelude::locate(const NativeOptions& o, const std::string& identity) {
  if (looked_) return;
  looked_ = true;
  // GCC's precompiled headers only (clang reads them with other flags; another compiler
  // that fails to build one is tried once and then compiles without).
  if (o.prelude_dir.empty() || o.prelude_headers.empty() || identity.find("clang") != std::string::npos) return;
  text_ = "// neuron-eager: the headers every tier-2 kernel includes first (precompiled)\n";
  for (const auto& h : o.prelude_headers) text_ += "#include <" + h + ">\n";
  std::string material = text_ + "\n--compiler " + o.compiler + " " + identity + "\n--flags";
  for (const auto& f : o.flags) material += " " + f;
  material += "\n--version " + o.version;
  header_ = o.prelude_dir + "/" + hex64(XXH3_64bits(material.data(), material.size())) + "/neuron_prelude.h";
  std::error_code ec;
  if (fs::exists(header_ + ".gch", ec) && read_text(header_, 1 << 16) == text_) include_ = header_;
}

void CompilePrelude::find(const NativeOptions& o, const std::string& identity) {
  std::lock_guard lock(mutex_);
  locate(o, identity);
}

void CompilePrelude::prepare(const NativeOptions& o, const std::string& identity) {
  std::unique_lock lock(mutex_, std::try_to_lock);
  if (!lock.owns_lock() || tried_) return;  // another build thread is at it, or done
  tried_ = true;
  locate(o, identity);
  if (header_.empty() || !include_.empty()) return;  // none possible, or built already
  const std::string text = text_, header = header_, pch = header + ".gch";
  const std::string dir = fs::path(header).parent_path().string();
  std::error_code ec;
  fs::create_directories(dir, ec);
  // Leftovers of a process that died while building (each is ~100 MB).
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.find(".tmp.") == std::string::npos) continue;
    const auto age = fs::file_time_type::clock::now() - fs::last_write_time(e.path(), ec);
    if (!ec && age > std::chrono::minutes(10)) fs::remove(e.path(), ec);
  }
  if (!write_atomic(header, text)) return;
  const std::string tag = std::to_string(getpid());
  const std::string tmp = pch + ".tmp." + tag, log = header + ".log.tmp." + tag;
  std::vector<std::string> argv = {o.compiler};
  argv.insert(argv.end(), o.flags.begin(), o.flags.end());
  argv.insert(argv.end(), {"-fPIC", "-x", "c++-header", header, "-o", tmp});
  const int status = run_process(argv, log, o.compile_timeout_ms, {tmp});
  fs::remove(log, ec);
  if (status != 0 || !fs::exists(tmp, ec)) {
    fs::remove(tmp, ec);
    return;
  }
  fs::rename(tmp, pch, ec);
  if (!ec) include_ = header;
}

}  // namespace neuron::fusion
