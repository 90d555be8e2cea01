// The only pybind11 file: the neuron_eager._C extension.
#include <torch/csrc/Generator.h>
#include <torch/csrc/utils/pybind.h>
#include <pybind11/functional.h>
#include <pybind11/numpy.h>

#include <stdexcept>

#include "backend/runtime.h"
#include "backend/segment_work.h"
#include "distributed/process_group.h"
#include "engine/adaptive_guard.h"
#include "engine/compiled_region.h"
#include "engine/engine.h"
#include "engine/fast_meta.h"
#include "engine/native_config.h"
#include "engine/recording.h"
#include "fusion/cache_hygiene.h"
#include "fusion/native.h"
#include "fusion/policy.h"
#include "fusion/replay.h"
#include "trace/counters.h"
#include "trace/recorder.h"
#include "trace/segmenter.h"

namespace py = pybind11;
using namespace neuron;

namespace {

c10::DeviceIndex index_or_current(int index) {
  return index < 0 ? engine::current_device() : static_cast<c10::DeviceIndex>(index);
}

void check_device(int index) {
  if (index < 0 || index >= engine::device_count())
    throw py::index_error("neuron: invalid device index " + std::to_string(index) + "; there are " +
                          std::to_string(engine::device_count()) + " NeuronCores (NEURON_CORES)");
}

py::dict memory_stats(int index) {
  check_device(index);
  auto s = backend::memory(index).stats();
  py::dict d;
  auto put = [&](const std::string& name, const backend::MemoryStat& st) {
    d[(name + ".all.current").c_str()] = st.current;
    d[(name + ".all.peak").c_str()] = st.peak;
    d[(name + ".all.allocated").c_str()] = st.allocated;
    d[(name + ".all.freed").c_str()] = st.freed;
  };
  put("allocated_bytes", s.allocated_bytes);
  put("active_bytes", s.allocated_bytes);
  put("requested_bytes", s.requested_bytes);
  put("reserved_bytes", s.reserved_bytes);
  put("allocation", s.allocations);
  put("segment", s.segments);
  d["num_alloc_retries"] = s.num_alloc_retries;
  d["num_ooms"] = s.num_ooms;
  d["num_device_alloc"] = s.num_device_alloc;
  d["num_device_free"] = s.num_device_free;
  d["hbm_capacity_bytes"] = backend::memory(index).capacity();
  return d;
}

}  // namespace

// Blocking waits drop the GIL when the waiting thread holds it.
void wait_without_gil(void (*wait)(void*), void* arg) {
  if (Py_IsInitialized() && PyGILState_Check()) {
    py::gil_scoped_release no_gil;
    wait(arg);
  } else {
    wait(arg);
  }
}

// The Python stack of the calling thread for the first sync of each cause, or "" when
// the thread is not a Python thread.
std::string capture_python_stack() {
  if (!Py_IsInitialized() || PyGILState_GetThisThreadState() == nullptr) return "";
  py::gil_scoped_acquire gil;
  try {
    auto tb = py::module_::import("traceback");
    py::list frames = tb.attr("format_stack")();
    std::string out;
    for (auto f : frames) out += py::str(f).cast<std::string>();
    return out;
  } catch (const std::exception&) {
    return "";
  }
}

PYBIND11_MODULE(_C, m) {
  m.doc() = "neuron-eager engine bindings";
  backend::Stream::set_wait_wrapper(&wait_without_gil);
  m.def("_init", [] {
    try {
      engine::init_from_env();
    } catch (const std::invalid_argument& e) {
      throw py::value_error(e.what());
    }
  });
  m.def("get_mode", [] { return std::string(engine::mode_name(engine::mode())); });
  m.def("set_mode", [](const std::string& name) {
    engine::Mode mode;
    if (!engine::parse_mode(name, mode))
      throw py::value_error("neuron: mode '" + name + "' is not valid: expected one of: eager, adaptive");
    engine::flush_all_windows();
    engine::set_mode(mode);
  });
  // torch.compile(backend="neuron") brackets each run of a captured graph with these.
  m.def(
      "enter_compiled_region", [](uint64_t graph, bool autotune) { engine::enter_compiled_region(graph, autotune); },
      py::arg("graph"), py::arg("autotune") = false);
  m.def("exit_compiled_region", [] { engine::exit_compiled_region(); });
  m.def("launch_blocking", [] { return engine::launch_blocking(); });
  m.def("set_launch_blocking", [](bool on) { engine::set_launch_blocking(on); });
  m.def("device_count", [] { return engine::device_count(); });
  m.def("current_device", [] { return static_cast<int>(engine::current_device()); });
  m.def("set_device", [](int index) {
    check_device(index);
    engine::set_current_device(static_cast<c10::DeviceIndex>(index));
  });
  m.def("current_stream_id", [](int index) {
    return engine::current_stream_id(index_or_current(index));
  });
  m.def("set_stream", [](int index, int64_t id) {
    engine::set_current_stream_id(index_or_current(index), id);
  });
  m.def("synchronize", [](int index) {
    py::gil_scoped_release no_gil;
    if (index < 0)
      engine::synchronize_all("torch.neuron.synchronize");
    else
      engine::synchronize(static_cast<c10::DeviceIndex>(index), "torch.neuron.synchronize");
  }, py::arg("device") = -1);
  m.def("pending_work", [](int index) {
    engine::flush_windows(index_or_current(index));  // held ops count as pending
    return backend::pending_work(index_or_current(index));
  }, py::arg("device") = -1);
  m.def("memory_stats", &memory_stats);
  m.def("reset_peak_memory_stats", [](int index) {
    check_device(index);
    backend::memory(index).reset_peaks();
  });
  m.def("reset_accumulated_memory_stats", [](int index) {
    check_device(index);
    backend::memory(index).reset_accumulated();
  });
  m.def("empty_cache", [] {
    py::gil_scoped_release no_gil;
    for (int i = 0; i < engine::device_count(); ++i) {
      engine::flush_windows(static_cast<c10::DeviceIndex>(i));
      backend::drain_core(i);
      backend::memory(i).empty_cache();
    }
  });
  m.def("hbm_bytes", [] { return backend::hbm_bytes(); });
  m.def("default_generator", [](int index) {
    check_device(index);
    return py::reinterpret_steal<py::object>(
        THPGenerator_initDefaultGenerator(engine::default_generator(index)));
  });
  m.def("counters", [] {
    auto c = engine::counters();
    py::dict d;
    d["ops_dispatched"] = c.ops_dispatched;
    d["ops_queued"] = c.ops_queued;
    d["ops_synchronous"] = c.ops_synchronous;
    d["meta_runs"] = c.meta_runs;
    d["fast_meta_runs"] = c.fast_meta_runs;
    d["shape_cache_hits"] = c.shape_cache_hits;
    d["shape_cache_misses"] = c.shape_cache_misses;
    d["views"] = c.views;
    d["syncs"] = c.syncs;
    int64_t busy = 0;
    for (int i = 0; i < backend::core_count(); ++i) busy += backend::busy_time_ns(i);
    d["device_busy_ns"] = busy;
    // Every module's registered counters (the controller's, the guard's, tier 2's, the
    // compile cache's, thread trials), by name.
    for (const auto& [name, value] : trace::counter_values()) d[py::str(name)] = value;
    return d;
  });
  m.def("reset_fusion_state", [] {
    py::gil_scoped_release no_gil;
    engine::reset_fusion_state();
  });
  m.def("native_wait_idle", [] {
    py::gil_scoped_release no_gil;
    fusion::NativeCompiler::instance().wait_idle();
  });
  m.def("native_cache_dir", [] {
    engine::configure_native_once();
    return fusion::NativeCompiler::instance().options().cache_dir;
  });
  m.def("native_cache_max_bytes", [] {
    engine::configure_native_once();
    return fusion::NativeCompiler::instance().options().cache_max_bytes;
  });
  // The cache under a root (neuron_eager.cache): entries, and with checksums each
  // kernel's state ("intact", "corrupt"; "" without an object).
  m.def("native_cache_scan", [](const std::string& root, bool checksums) {
    const auto cache = fusion::NativeCache::in_root(root);
    fusion::CacheUsage u;
    {
      py::gil_scoped_release no_gil;
      u = fusion::scan_cache(cache);
    }
    py::list entries;
    for (const auto& e : u.entries) {
      py::dict d;
      d["key"] = e.key;
      d["bytes"] = e.bytes;
      d["last_use"] = static_cast<double>(e.last_use_ns) * 1e-9;
      d["kernel"] = e.has_object;
      d["verified"] = e.verified;
      std::string state;
      if (checksums && e.has_object) {
        py::gil_scoped_release no_gil;
        state = cache.check(e.key) == fusion::NativeCache::Entry::kIntact ? "intact" : "corrupt";
      }
      d["state"] = state;
      entries.append(d);
    }
    py::dict d;
    d["dir"] = cache.dir();
    d["entries"] = entries;
    d["total_bytes"] = u.total_bytes;
    d["temporaries"] = u.temporaries;
    d["temporary_bytes"] = u.temporary_bytes;
    return d;
  }, py::arg("root"), py::arg("checksums") = false);
  m.def("native_cache_clear", [](const std::string& root) {
    fusion::Cleared c;
    {
      py::gil_scoped_release no_gil;
      c = fusion::clear_cache(fusion::NativeCache::in_root(root));
    }
    return py::make_tuple(c.removed, c.busy, c.temporaries);
  });
  m.def("reset_counters", [] { engine::reset_counters(); });
  m.def("clear_shape_cache", [] { engine::clear_shape_cache(); });
  m.def("_inject_tile_group_failures", [](int n) { backend::inject_tile_group_failures(n); });
  engine::set_stack_capture(&capture_python_stack);
  m.def("trace_start", [](const std::string& path, const std::string& user_json) {
    engine::start_trace(path, user_json);
  }, py::arg("path"), py::arg("metadata_json") = "");
  m.def("trace_stop", [] {
    uint64_t events = 0;
    {
      py::gil_scoped_release no_gil;
      events = engine::stop_trace();
    }
    return py::make_tuple(events, trace::Recorder::instance().bytes_written());
  });
  m.def("policy_json", [] { return fusion::policy_json(engine::active_policy()); });
  m.def("fast_meta_ops", [] { return engine::fast_meta_ops(); });
  m.def("fast_meta_mismatches", [] { return engine::fast_meta_mismatches(); });
  m.def("policy_knobs", [] { return fusion::describe_policy_knobs(); });
  m.def("builtin_policies", [] { return fusion::builtin_policy_names(); });
  m.def("set_policy_builtin", [](const std::string& name) {
    auto p = fusion::builtin_policy(name);
    if (!p) throw py::value_error("neuron: unknown built-in policy '" + name +
                                  "' (allowed: default, aggressive, conservative, never)");
    engine::set_active_policy(*p);
  });
  m.def("set_policy_file", [](const std::string& path) {
    std::string error;
    auto p = fusion::load_policy_file(path, error);
    if (!p) throw py::value_error("neuron: " + error);
    engine::set_active_policy(*p);
  });
  m.def("set_policy_values", [](const std::string& base, const std::vector<std::pair<std::string, std::string>>& values) {
    auto p = fusion::builtin_policy(base);
    if (!p) throw py::value_error("neuron: unknown built-in policy '" + base + "'");
    std::string error;
    for (const auto& [k, v] : values)
      if (!fusion::set_policy_value(*p, k, v, error)) throw py::value_error("neuron: " + error);
    engine::set_active_policy(*p);
  });
  m.def("trace_active", [] { return trace::recording(); });
  m.def("trace_path", [] { return trace::Recorder::instance().path(); });
  m.def("segment_cache_stats", [] {
    auto s = engine::trace_cache().stats();
    py::dict d;
    d["segments"] = engine::trace_cache().size();
    d["hits"] = s.hits;
    d["misses"] = s.misses;
    d["collisions"] = s.collisions;
    d["illegal_transitions"] = s.illegal_transitions;
    py::dict moves;
    using trace::SegmentState;
    for (size_t from = 0; from < static_cast<size_t>(SegmentState::kCount); ++from)
      for (size_t to = 0; to < static_cast<size_t>(SegmentState::kCount); ++to)
        if (s.transitions[from][to] > 0)
          moves[py::str(std::string(trace::state_name(static_cast<SegmentState>(from))) + "->" +
                        trace::state_name(static_cast<SegmentState>(to)))] = s.transitions[from][to];
    d["transitions"] = moves;
    return d;
  });
  // Offline replay (neuron_eager.trace.replay): a trace's events in, decisions and
  // predicted times out. Nothing runs on the device.
  py::class_<fusion::ReplayTrace, std::shared_ptr<fusion::ReplayTrace>>(m, "_ReplayTrace")
      .def_property_readonly("ops", [](const fusion::ReplayTrace& t) { return t.seq.size(); })
      .def_property_readonly("recorded_segments", [](const fusion::ReplayTrace& t) { return t.segments.size(); })
      .def_property_readonly("has_dataflow", [](const fusion::ReplayTrace& t) { return t.has_dataflow; })
      .def_property_readonly("has_stream_flush", [](const fusion::ReplayTrace& t) { return t.has_stream_flush; })
      .def_property_readonly("compiled_keys", [](const fusion::ReplayTrace& t) { return t.compiled_keys; });
  m.def("_matmul_class_ops", [] { return fusion::matmul_class_ops(); });
  m.def("_replay_prepare", [](py::buffer events) {
    py::buffer_info b = events.request();
    if (b.itemsize != sizeof(trace::Event) || b.ndim != 1)
      throw py::value_error("neuron: replay expects the trace's 56-byte event records");
    auto* ev = static_cast<const trace::Event*>(b.ptr);
    const size_t n = static_cast<size_t>(b.shape[0]);
    py::gil_scoped_release no_gil;
    return std::make_shared<fusion::ReplayTrace>(fusion::prepare_replay(ev, n));
  });
  m.def("_replay_policy", [](const std::string& base, const std::vector<std::pair<std::string, std::string>>& values) {
    std::string error;
    auto p = fusion::builtin_policy(base);
    if (!p) p = fusion::load_policy_file(base, error);
    if (!p) throw py::value_error("neuron: " + error);
    for (const auto& [k, v] : values)
      if (!fusion::set_policy_value(*p, k, v, error)) throw py::value_error("neuron: " + error);
    return fusion::policy_json(*p);
  });
  m.def("_replay_run", [](const fusion::ReplayTrace& t, const std::string& base,
                          const std::vector<std::pair<std::string, std::string>>& values,
                          const std::string& cost, const std::map<std::string, double>& trn2,
                          const std::vector<uint32_t>& cut_after_ops, py::object hook,
                          const std::vector<uint32_t>& whole_run_ops,
                          const std::vector<std::string>& op_names) {
    fusion::ReplayOptions o;
    std::string error;
    auto p = fusion::builtin_policy(base);
    if (!p) p = fusion::load_policy_file(base, error);
    if (!p) throw py::value_error("neuron: " + error);
    for (const auto& [k, v] : values)
      if (!fusion::set_policy_value(*p, k, v, error)) throw py::value_error("neuron: " + error);
    o.policy = *p;
    o.cut_after_ops = cut_after_ops;
    o.whole_run_ops = whole_run_ops;
    for (const auto& name : op_names) o.op_kinds.push_back(name.empty() ? 0 : trace::op_kind(name));
    if (cost == "trn2") o.cost.source = fusion::CostSource::kTrn2;
    else if (cost != "measured") throw py::value_error("neuron: cost model '" + cost + "' (allowed: measured, trn2)");
    for (const auto& [k, v] : trn2) {
      if (k == "hbm_bytes_per_s") o.cost.trn2.hbm_bytes_per_s = v;
      else if (k == "tensor_flops_per_s") o.cost.trn2.tensor_flops_per_s = v;
      else if (k == "vector_flops_per_s") o.cost.trn2.vector_flops_per_s = v;
      else if (k == "launch_overhead_ns") o.cost.trn2.launch_overhead_ns = v;
      else if (k == "sbuf_bytes") o.cost.trn2.sbuf_bytes = v;
      else if (k == "fused_ratio_default") o.cost.fused_ratio_default = v;
      else throw py::value_error("neuron: unknown cost model constant '" + k + "'");
    }
    fusion::ReplayResult r;
    if (!hook.is_none()) {
      o.should_compile = [hook](const fusion::ReplaySegment& s) {
        py::dict d;
        d["key"] = s.key;
        d["length"] = s.length;
        d["first_op"] = s.first_op;
        d["count"] = s.count;
        d["per_op_ns"] = s.per_op_ns;
        d["fused_ns"] = s.fused_ns;
        return hook(d).cast<bool>();
      };
      r = fusion::replay(t, o);
    } else {
      py::gil_scoped_release no_gil;
      r = fusion::replay(t, o);
    }
    py::dict d;
    d["policy"] = fusion::policy_json(o.policy);
    d["device_ns"] = r.device_ns;
    d["per_op_ns"] = r.per_op_ns;
    d["fused_ns"] = r.fused_ns;
    d["compile_ns"] = r.compile_ns;
    d["compiles"] = r.compiles;
    d["native_compiles"] = r.native_compiles;
    d["ops"] = r.ops;
    d["ops_fused"] = r.ops_fused;
    d["occurrences"] = r.occurrences;
    d["occurrences_fused"] = r.occurrences_fused;
    d["key_mismatches"] = r.key_mismatches;
    d["matched_segments"] = r.matched_segments;
    d["fused_ratio"] = r.fused_ratio;
    py::list keys;
    for (const auto& k : r.keys) {
      py::dict kd;
      kd["key"] = k.key;
      kd["length"] = k.length;
      kd["first_op"] = k.first_op;
      kd["occurrences"] = k.occurrences;
      kd["fused"] = k.fused;
      kd["compiled_at"] = k.compiled_at;
      kd["decision"] = k.decision;
      kd["native"] = k.native;
      kd["per_op_ns"] = k.per_op_ns;
      kd["fused_ns"] = k.fused_ns;
      keys.append(kd);
    }
    d["keys"] = keys;
    d["occ_stream"] = py::array_t<uint32_t>(r.occ_stream.size(), r.occ_stream.data());
    d["occ_first_seq"] = py::array_t<uint64_t>(r.occ_first_seq.size(), r.occ_first_seq.data());
    d["occ_length"] = py::array_t<uint32_t>(r.occ_length.size(), r.occ_length.data());
    d["occ_key"] = py::array_t<uint64_t>(r.occ_key.size(), r.occ_key.data());
    d["occ_reason"] = py::array_t<uint8_t>(r.occ_reason.size(), r.occ_reason.data());
    d["occ_fused"] = py::array_t<uint8_t>(r.occ_fused.size(), r.occ_fused.data());
    d["compiled_keys"] = r.compiled_keys;
    return d;
  }, py::arg("trace"), py::arg("base"), py::arg("values"), py::arg("cost") = "measured",
     py::arg("trn2") = std::map<std::string, double>{}, py::arg("cut_after_ops") = std::vector<uint32_t>{},
     py::arg("hook") = py::none(), py::arg("whole_run_ops") = std::vector<uint32_t>{},
     py::arg("op_names") = std::vector<std::string>{});

  // torch.distributed: the `neuron` c10d backend, with a host backend (Gloo) as transport.
  m.def("_process_group_backend", [](c10::intrusive_ptr<c10d::Backend> host, int rank, int size) {
    std::shared_ptr<distributed::Transport> transport = distributed::host_backend_transport(std::move(host));
    return c10::intrusive_ptr<c10d::Backend>(c10::make_intrusive<distributed::NeuronBackend>(rank, size, transport));
  }, py::arg("host"), py::arg("rank"), py::arg("size"));
}
