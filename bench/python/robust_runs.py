"""robust.py's processes: the child that runs one cell under one config (CPU eager, neuron
eager, adaptive cold or warm) and stamps the clock at every host read, and the parent's
side that starts it, turns its stamps into a warm-up curve, measures how busy the other
cores were meanwhile and compares its results with CPU eager's bit for bit."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from robust_programs import make_program  # noqa: E402
from robust_workloads import PREAMBLE, make_workload  # noqa: E402

# --- the child: one cell under one config -------------------------------------------------

# --- the child: one cell under one config -------------------------------------------------

def peak_rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def child(cfg_path: str) -> None:
    with open(cfg_path) as f:
        cfg = json.load(f)
    import torch

    device = "cpu" if cfg["config"] == "cpu" else "neuron"
    cell, plan = cfg["cell"], cfg["cell"]["plan"]

    def make(small):
        if "workload" in cell:
            return make_workload(cell["workload"], 2 if small else 0 if cfg["tiny"] else 1,
                                 device)
        spec = cell["program"]
        if small:  # 8 rows: no row count of the cell itself (those exceed rows/2 >= 8)
            spec = dict(spec, rows=8, every=0, input_seed=spec["input_seed"] + 7)
        return make_program(spec, device)

    # Preamble: the cell's own code at a small size, twice. A fresh process pays lazy
    # imports (Python meta kernels on neuron) and library set-up (oneDNN, MKL) on its
    # first ops, seconds in all; that is not adaptive mode's warm-up, which is keyed by
    # shapes the preamble never uses.
    pre_step, pre_read, _ = make(True)
    for i in range(PREAMBLE):
        pre_step(i)
    pre_read()
    step, read, result = make(False)
    if device != "cpu":
        import neuron_eager
        assert neuron_eager.get_mode() == cfg["mode"], (neuron_eager.get_mode(), cfg["mode"])
        torch.neuron.synchronize()
        neuron_eager.reset_counters()
    reads = cell["reads"]
    marks = [(0, time.perf_counter())]
    for i in range(plan["iters"]):
        step(i)
        if (i + 1) % reads == 0:
            read()  # a host read waits for the queued work
            marks.append((i + 1, time.perf_counter()))
    fig = {"marks": [(n, t - marks[0][1]) for n, t in marks], "peak_rss": peak_rss_bytes()}
    if device != "cpu":
        import neuron_eager
        so = neuron_eager._C.__file__  # which build ran: others may reinstall meanwhile
        fig["build"] = f"{os.path.getmtime(so):.0f}:{os.path.getsize(so)}"
        fig["counters"] = neuron_eager.counters()
        fig["max_memory_allocated"] = torch.neuron.max_memory_allocated()
        if cfg["mode"] == "adaptive":
            # The cold process leaves a complete cache for the warm one (not timed).
            neuron_eager._C.native_wait_idle()
    torch.save(result(), cfg["result_path"])
    with open(cfg["fig_path"], "w") as f:
        json.dump(fig, f)


# --- the parent: figures from the marks ---------------------------------------------------


def curve(marks: list, plan: dict) -> dict:
    """ms per iteration over the warm-up windows and the steady blocks."""
    at = dict(marks)

    def per_iter(a, b):
        return (at[b] - at[a]) / (b - a) * 1e3

    w1, w2, block, iters = plan["w1"], plan["w2"], plan["block"], plan["iters"]
    blocks = [per_iter(a, a + block) for a in range(w2, iters, block)]
    later = blocks[1:] if len(blocks) >= 3 else blocks
    return {"first_ms": per_iter(0, w1), "early_ms": per_iter(w1, w2) if w2 > w1 else None,
            "steady_ms": statistics.median(later), "blocks_ms": blocks}


def bits_equal(a, b) -> tuple[bool, str]:
    """Bit-for-bit equality of two results (dicts of CPU tensors)."""
    import torch

    if set(a) != set(b):
        return False, f"keys differ: {sorted(set(a) ^ set(b))}"
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    for k in a:
        x, y = a[k], b[k]
        if x.dtype != y.dtype or x.shape != y.shape:
            return False, f"{k}: {x.dtype}{tuple(x.shape)} vs {y.dtype}{tuple(y.shape)}"
        if x.is_floating_point():
            xi = x.contiguous().view(ints[x.element_size()])
            yi = y.contiguous().view(ints[y.element_size()])
        else:
            xi, yi = x, y
        if not torch.equal(xi, yi):
            diff = (xi != yi).sum().item()
            detail = f"{k}: {diff} of {x.numel()} elements differ"
            if x.is_floating_point():
                detail += (f" (max abs diff {(x.double() - y.double()).abs().nan_to_num(0).max().item():.3g},"
                           f" torch.equal {torch.equal(x, y)})")
            return False, detail
    return True, ""


def busy_seconds() -> float:
    """CPU seconds every core has spent busy so far (all processes on the machine)."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def children_seconds() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_measured(cmd, env, timeout):
    """subprocess.run, plus the cores that other work on the machine kept busy meanwhile
    (all busy time less this child's own CPU time, over its wall time)."""
    busy0, kids0, t0 = busy_seconds(), children_seconds(), time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    others = (busy_seconds() - busy0 - (children_seconds() - kids0)) / max(wall, 1e-9)
    return proc, wall, max(0.0, others)


def run_child(cell: dict, config: str, work: str, cache_dir: str, tiny: bool,
              timeout: float) -> dict:
    tag = f"cell{cell['index']}_{config}"
    cfg = {"cell": cell, "config": config, "tiny": tiny,
           "mode": "eager" if config in ("cpu", "eager") else "adaptive",
           "result_path": os.path.join(work, tag + ".pt"),
           "fig_path": os.path.join(work, tag + ".json")}
    cfg_path = os.path.join(work, tag + ".cfg.json")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    env = dict(os.environ)
    if config == "cpu":
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"  # plain PyTorch
    else:
        env["NEURON_EAGER_MODE"] = cfg["mode"]
        env["NEURON_CACHE_DIR"] = cache_dir
    try:
        proc, wall, others = run_measured(
            [sys.executable, os.path.join(HERE, "robust.py"), "--child", cfg_path], env, timeout)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timed out after {timeout:.0f} s"}
    if proc.returncode != 0:
        return {"ok": False, "error": (proc.stderr or proc.stdout)[-1500:].strip()}
    with open(cfg["fig_path"]) as f:
        fig = json.load(f)
    fig.update(ok=True, wall_s=wall, other_cores_busy=others, result_path=cfg["result_path"])
    fig.update(curve(fig["marks"], cell["plan"]))
    return fig
