#include "engine/native_config.h"

#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>

#include "engine/engine.h"
#include "fusion/native.h"

namespace neuron::engine {

void configure_native_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    fusion::NativeOptions o;
    const Config& c = config();
    o.compiler = c.cxx.empty() ? "c++" : c.cxx;
    o.cache_dir = c.cache_dir;
    if (c.cache_max_bytes != 0) o.cache_max_bytes = c.cache_max_bytes;
    if (c.compile_timeout_ms != 0) o.compile_timeout_ms = c.compile_timeout_ms;
    if (o.cache_dir.empty()) {
      const char* xdg = std::getenv("XDG_CACHE_HOME");
      const char* home = std::getenv("HOME");
      if (xdg != nullptr && *xdg) o.cache_dir = std::string(xdg) + "/neuron-eager";
      else if (home != nullptr && *home) o.cache_dir = std::string(home) + "/.cache/neuron-eager";
    }
    // The precompiled prelude is shared by every cache folder of this user (it depends only
    // on compiler, flags and versions, and is ~100 MB): NEURON_PRELUDE_DIR, else the
    // default cache's pch folder; "off" builds none.
    const char* prelude = std::getenv("NEURON_PRELUDE_DIR");
    if (prelude != nullptr && *prelude) {
      o.prelude_dir = std::string(prelude) == "off" ? "" : prelude;
    } else {
      const char* xdg = std::getenv("XDG_CACHE_HOME");
      const char* home = std::getenv("HOME");
      if (xdg != nullptr && *xdg) o.prelude_dir = std::string(xdg) + "/neuron-eager/pch";
      else if (home != nullptr && *home) o.prelude_dir = std::string(home) + "/.cache/neuron-eager/pch";
    }
    o.prelude_headers = {"ATen/cpu/vec/vec.h", "ATen/cpu/vec/functional.h", "array", "algorithm", "cmath",
                         "cstdint", "cstring", "limits", "type_traits"};
    std::string include, lib_dir, lib;
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&at::get_num_threads), &info) != 0 && info.dli_fname) {
      lib = info.dli_fname;  // .../torch/lib/libtorch_cpu.so
      lib_dir = lib.substr(0, lib.rfind('/'));
      include = lib_dir + "/../include";
    }
    // ATen's vector math (Sleef) lives in libtorch_cpu.
    o.link_flags = {"-L" + lib_dir, "-Wl,--no-as-needed", "-ltorch_cpu", "-Wl,-rpath," + lib_dir};
    if (!lib.empty()) o.stub_libraries = {{lib.substr(lib.rfind('/') + 1), lib_dir}};
    o.flags = {"-O2", "-std=gnu++17", "-w", "-fno-math-errno", "-fno-trapping-math",
               "-D_GLIBCXX_USE_CXX11_ABI=" + std::to_string(_GLIBCXX_USE_CXX11_ABI),
               "-isystem", include};
    const std::string isa = at::get_cpu_capability();  // what ATen's kernels were picked for
    if (isa == "AVX2")
      o.flags.insert(o.flags.end(), {"-mavx2", "-mfma", "-mbmi", "-mbmi2", "-mf16c",
                                     "-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"});
    else if (isa == "AVX512")
      o.flags.insert(o.flags.end(), {"-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq",
                                     "-mfma", "-mf16c", "-DCPU_CAPABILITY=AVX512",
                                     "-DCPU_CAPABILITY_AVX512"});
    else
      o.flags.insert(o.flags.end(), {"-DCPU_CAPABILITY=DEFAULT", "-DCPU_CAPABILITY_DEFAULT"});
    o.version = std::string("neuron-eager ") + NEURON_VERSION + " torch " + NEURON_TORCH_VERSION +
                " codegen 3";
    fusion::NativeCompiler::instance().configure(std::move(o));
  });
}

}  // namespace neuron::engine
