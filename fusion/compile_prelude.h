// The precompiled prelude of tier-2 kernels: the headers every generated kernel includes
// first (ATen's vector library, a third of a million lines once preprocessed) compiled
// once per compiler, flags and engine version into a GCC precompiled header, then handed
// to each kernel compile with -include. A kernel compiles to the same object with or
// without it (the same text is parsed either way), in about a third of the time (1.7 s ->
// 0.6 s for a row kernel on this VM); when it is missing or unusable, compiles go on
// without it.
#pragma once

#include <mutex>
#include <string>
#include <vector>

namespace neuron::fusion {

struct NativeOptions;

class CompilePrelude {
 public:
  // The header to pass with -include once its precompiled form is built; "" until then,
  // or when it cannot be built (no folder, not GCC, the build failed).
  std::string include_path() const;
  // Takes a prelude an earlier process built, if there is one (a file check, once per
  // process: the first compile uses it too).
  void find(const NativeOptions& options, const std::string& compiler_identity);
  // Builds the precompiled header under options.prelude_dir unless it exists or was tried
  // in this process (blocking: the background compile pool calls it after a build). A
  // second process that finds it built only checks it is there.
  void prepare(const NativeOptions& options, const std::string& compiler_identity);

 private:
  mutable std::mutex mutex_;
  bool tried_ = false, looked_ = false;
  // The prelude's header text and its path for these options ("" : none possible).
  std::string text_, header_;
  void locate(const NativeOptions& o, const std::string& identity);
  std::string include_;
};

}  // namespace neuron::fusion
