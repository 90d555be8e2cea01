#include "fusion/link_stub.h"

#include <unistd.h>
#include <xxhash.h>

#include <filesystem>
#include <system_error>

#include "fusion/atomic_file.h"
#include "fusion/compiler_process.h"
#include "fusion/native.h"

namespace neuron::fusion {
namespace fs = std::filesystem;

std::vector<std::string> LinkStubs::link_flags(const NativeOptions& o, const std::string& identity) {
  std::lock_guard lock(mutex_);
  if (!tried_) {
    tried_ = true;
    if (o.prelude_dir.empty() || o.stub_libraries.empty()) return o.link_flags;
    std::string material = o.compiler + " " + identity + "\n--version " + o.version;
    for (const auto& lib : o.stub_libraries) material += "\n" + lib.soname + " " + lib.run_dir;
    const std::string dir =
        o.prelude_dir + "/link-" + hex64(XXH3_64bits(material.data(), material.size()));
    std::error_code ec;
    fs::create_directories(dir, ec);
    std::vector<std::string> flags = {"-L" + dir, "-Wl,--no-as-needed"};
    for (const auto& lib : o.stub_libraries) {
      const std::string path = dir + "/" + lib.soname;
      if (!fs::exists(path, ec)) {
        const std::string tag = std::to_string(getpid());
        const std::string src = path + ".tmp." + tag + ".c", tmp = path + ".tmp." + tag;
        if (!write_atomic(src, "/* neuron-eager: link stand-in for " + lib.soname + " */\n")) return o.link_flags;
        const int status = run_process({o.compiler, "-shared", "-fPIC", "-x", "c", src, "-o", tmp,
                                        "-Wl,-soname," + lib.soname},
                                       tmp + ".log", o.compile_timeout_ms, {tmp});
        fs::remove(src, ec);
        fs::remove(tmp + ".log", ec);
        if (status != 0) {
          fs::remove(tmp, ec);
          return o.link_flags;
        }
        fs::rename(tmp, path, ec);
        if (ec) return o.link_flags;
      }
      flags.push_back("-l:" + lib.soname);
      flags.push_back("-Wl,-rpath," + lib.run_dir);
    }
    flags_ = std::move(flags);
  }
  return flags_.empty() ? o.link_flags : flags_;
}

}  // namespace neuron::fusion
