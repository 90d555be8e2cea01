// Link stand-ins for the libraries tier-2 kernels need at run time. A kernel calls into
// libtorch_cpu (ATen's vector math: Sleef, VML), which this process has loaded already;
// linking it against the real library makes the linker read all 430 MB of it, 0.4 s of a
// 1 s build on this VM, and most of the cache and memory traffic a build costs the
// running program. The kernel links instead against an empty shared library with the
// same soname: its DT_NEEDED entry names the library, and at dlopen the loaded one
// resolves its symbols (a shared object may leave symbols undefined at link time). Built
// once per compiler under the prelude's folder; without one, kernels link as before.
#pragma once

#include <mutex>
#include <string>
#include <vector>

namespace neuron::fusion {

struct NativeOptions;

class LinkStubs {
 public:
  // The link flags for a kernel: against the stand-ins once they exist (building them on
  // the first call, blocking, about 0.1 s), else options.link_flags.
  std::vector<std::string> link_flags(const NativeOptions& options, const std::string& compiler_identity);

 private:
  std::mutex mutex_;
  bool tried_ = false;
  std::vector<std::string> flags_;  // empty: none (use options.link_flags)
};

}  // namespace neuron::fusion
