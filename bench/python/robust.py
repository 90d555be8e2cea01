"""Robustness benchmark: adaptive mode against eager on seeded programs nobody tuned for.

A seeded generator writes op programs (pointwise chains with transcendental ops, layer
norm and a written-out RMSNorm, (log_)softmax, last-dim sum/mean/amax and ops on their
results, matmuls in between, transposes, reshapes, slices, in-place ops, broadcasting
along rows and columns, bf16 stretches between fp32 ones, batch sizes that change every
step or every few steps); beside them run four small workloads written here: MLP
training (AdamW), a CNN training step (conv, batch norm, SGD with momentum), a small
transformer training step and greedy decoding of a tiny transformer with a growing KV
cache. A cell is one program (or workload), one tensor size (all of the program's
tensors have it; a workload's is its largest activation) and one host-read interval
(`.item()` or `.cpu()` of a small reduction every 1, 10, 100 or 500 iterations).

Every cell runs in four fresh processes, one after the other: CPU eager (plain PyTorch,
neuron not loaded), neuron eager, neuron adaptive with an empty kernel cache
(NEURON_CACHE_DIR a new folder; the process waits for its background compiles before it
exits) and adaptive again in a second process sharing that cache (warm). Each process
first runs the cell's own code twice at a size no cell uses (8 rows; a workload's
preamble configuration), so lazy imports and library set-up, seconds that a fresh process
pays on its first ops whatever the mode, stay out of the curves; then it runs the cell's
iterations from the same seeded inputs and stamps the clock at every host read.

From the stamps, the warm-up curve: ms per iteration over iterations 0-50 ("first"),
50-300 ("early") and the steady state, the median of the blocks of max(50, reads)
iterations after iteration 300, the first such block dropped. Window ends round up to
the next read (with reads every 500: 0-500, no early window, 3 blocks of 500). Cells of
8 MiB and more use a short plan to bound their run time: windows 20 and 60, 3 blocks of
20 (32 MiB and more, and --tiny: 10 and 30, blocks of 10). Per cell it prints
adaptive/eager and adaptive/CPU (steady CPU or eager time over adaptive's: > 1 means
adaptive is faster), cold and warm, the curves, and whether every result (outputs,
persistent state, every host-read value) equals CPU eager's bit for bit (compared as
integers of their width, so -0.0 against 0.0 or a NaN payload counts as a difference;
both neuron configs must match). At the end: the worst cell, the median over all cells
and over cells whose tensors exceed 1 MiB, the cells below 0.95, the warm-up check (a
cell fails it when adaptive's first or early window, cold or warm, averages more than
1.5x its own steady state or more than eager's same window), and every bit mismatch with
its seed and cell. A cell during which other work kept more than 0.3 cores busy
(from /proc/stat) is marked noisy, and a cell whose neuron processes found different
builds of the package (someone reinstalled it meanwhile) says so.

    python bench/python/robust.py                        # 29 programs + 8 workload cells
    python bench/python/robust.py --seed 3 --cells 15 --workloads none
    python bench/python/robust.py --sizes 2M,8M --reads 1,10 --json out.json
    python bench/python/robust.py --seed 1 --only 4,17   # rerun single cells
    python bench/python/robust.py --list                 # the cells and their programs
    python bench/python/robust.py --tiny                 # CI: 3 small cells, ~1.5 min

The default (sizes 16K,256K,2M,8M,64M; reads 1,10,100,500; workloads with reads 1 and
10) takes about 35 minutes on this 2-core VM (148 processes). Sizes take K/M suffixes
(KiB, MiB), multiples of 16K from 16K to 256M; reads 1 to 1000. Programs at 8M and more
run with reads up to 10 and at 32M and more with a read every iteration (longer
intervals would take minutes per process there); `--sizes`/`--reads` combinations
outside that rule are skipped. `--cells N` runs the first N program cells (they cycle
through the allowed size and read combinations); workloads take reads up to 10.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_common import write_json  # noqa: E402
from robust_programs import (KIB, MIB, fmt_size, gen_program, make_program, parse_size,  # noqa: E402
                             read_limit)
from robust_workloads import PREAMBLE, make_workload, workload_bytes  # noqa: E402

DEFAULT_SIZES = "16K,256K,2M,8M,64M"
DEFAULT_READS = "1,10,100,500"
DEFAULT_CELLS = 29
WORKLOADS = ("mlp", "cnn", "transformer", "decode")
CONFIGS = ("cpu", "eager", "cold", "warm")
SLOW_RATIO = 0.95
WARMUP_SLACK = 1.5
NOISY_CORES = 0.3  # other work keeping more cores busy than this marks a cell noisy

# --- cells and iteration plans ------------------------------------------------------------


def plan_for(size: int, reads: int, tiny: bool) -> dict:
    """Window ends (w1, w2), steady block length and count; iterations = w2 + blocks."""
    if tiny or size >= 32 * MIB:
        w1, w2, block, nblocks = 10, 30, 10, 3
    elif size >= 8 * MIB:
        w1, w2, block, nblocks = 20, 60, 20, 3
    else:
        w1, w2, block, nblocks = 50, 300, 50, 4
    up = lambda v: -(-v // reads) * reads  # noqa: E731  (the first read at or after v)
    w1, w2, block = up(w1), up(w2), up(block)
    if reads >= 500 and not tiny:
        nblocks = 3
    return {"w1": w1, "w2": w2, "block": block, "iters": w2 + nblocks * block}


def build_cells(args) -> list[dict]:
    cells = []
    if args.tiny:
        combos = [(16 * KIB, 1, "all", "every_k"), (256 * KIB, 10, "mixed", "static")]
        for i, (size, reads, flavor, shapes) in enumerate(combos[:args.cells]):
            cells.append({"program": gen_program(args.seed, i, size, flavor, shapes),
                          "size": size, "reads": reads})
    else:
        combos = [(s, r) for s in args.sizes for r in args.reads if r <= read_limit(s)]
        # Round-robin over combos, cheapest sizes first, so a small --cells still covers
        # every size and read interval; the biggest size gets one cell per pass at most.
        for i in range(args.cells):
            size, reads = combos[i % len(combos)]
            cells.append({"program": gen_program(args.seed, i, size), "size": size,
                          "reads": reads})
    wl_reads = [1] if args.tiny else [r for r in args.reads if r <= 10]
    for name in args.workloads:
        for reads in wl_reads:
            cells.append({"workload": name, "size": workload_bytes(name, args.tiny),
                          "reads": reads})
    for i, c in enumerate(cells):
        c["index"] = i
        c["plan"] = plan_for(c["size"], c["reads"], args.tiny)
        c["name"] = cell_name(c)
    return cells


def cell_name(c: dict) -> str:
    if "workload" in c:
        return f"{c['workload']} r{c['reads']}"
    p = c["program"]
    shape = "" if p["shapes"] == "static" else f" rows/{p['every']}"
    return (f"{p['flavor']} {fmt_size(c['size'])} {p['rows']}x{p['cols']}{shape} "
            f"{len(p['ops'])}ops r{c['reads']}")


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
            [sys.executable, os.path.abspath(__file__), "--child", cfg_path], env, timeout)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timed out after {timeout:.0f} s"}
    if proc.returncode != 0:
        return {"ok": False, "error": (proc.stderr or proc.stdout)[-1500:].strip()}
    with open(cfg["fig_path"]) as f:
        fig = json.load(f)
    fig.update(ok=True, wall_s=wall, other_cores_busy=others, result_path=cfg["result_path"])
    fig.update(curve(fig["marks"], cell["plan"]))
    return fig


def run_cell(cell: dict, work: str, args) -> dict:
    import torch

    cache_dir = os.path.join(work, f"cache{cell['index']}")
    os.makedirs(cache_dir)
    runs = {c: run_child(cell, c, work, cache_dir, args.tiny, args.timeout) for c in CONFIGS}
    row = {k: v for k, v in cell.items()}
    row["runs"] = runs
    if not all(r["ok"] for r in runs.values()):
        row["error"] = "; ".join(f"{c}: {r['error']}" for c, r in runs.items() if not r["ok"])
        return row
    ref = torch.load(runs["cpu"]["result_path"])
    row["bits"] = {}
    for c in CONFIGS[1:]:
        ok, detail = bits_equal(ref, torch.load(runs[c]["result_path"]))
        row["bits"][c] = {"equal": ok, "detail": detail}
    row["bit_equal"] = all(b["equal"] for b in row["bits"].values())
    for c in CONFIGS:
        os.remove(runs[c].pop("result_path"))
    cpu, eager = runs["cpu"]["steady_ms"], runs["eager"]["steady_ms"]
    row["adaptive_vs_eager"] = eager / runs["cold"]["steady_ms"]
    row["adaptive_vs_cpu"] = cpu / runs["cold"]["steady_ms"]
    row["warm_vs_eager"] = eager / runs["warm"]["steady_ms"]
    row["warm_vs_cpu"] = cpu / runs["warm"]["steady_ms"]
    row["eager_vs_cpu"] = cpu / eager
    row["warmup_violations"] = warmup_violations(runs)
    row["other_cores_busy"] = max(r["other_cores_busy"] for r in runs.values())
    row["builds"] = sorted({r["build"] for c, r in runs.items() if c != "cpu"})
    row["noisy"] = row["other_cores_busy"] > NOISY_CORES
    shutil.rmtree(cache_dir, ignore_errors=True)
    return row


def warmup_violations(runs: dict) -> list[str]:
    """Adaptive's first and early windows against its own steady state (x1.5) and against
    eager's same window."""
    out = []
    for c in ("cold", "warm"):
        r = runs[c]
        for w in ("first_ms", "early_ms"):
            v, e = r[w], runs["eager"][w]
            if v is None:
                continue
            if v > WARMUP_SLACK * r["steady_ms"]:
                out.append(f"{c} {w[:-3]} {v:.3g} ms > {WARMUP_SLACK}x steady {r['steady_ms']:.3g}")
            if v > e:
                out.append(f"{c} {w[:-3]} {v:.3g} ms > eager's {e:.3g}")
    return out


def fmt_curve(r: dict) -> str:
    early = "-" if r["early_ms"] is None else f"{r['early_ms']:.3g}"
    return f"{r['first_ms']:.3g}/{early}/{r['steady_ms']:.3g}"


def print_row(row: dict, total: int) -> None:
    head = f"cell {row['index']} of {total}: {row['name']}"
    if "error" in row:
        print(f"{head}: ERROR {row['error'][:600]}", flush=True)
        return
    r = row["runs"]
    bits = "bits ok" if row["bit_equal"] else "BIT MISMATCH " + "; ".join(
        f"{c}: {b['detail']}" for c, b in row["bits"].items() if not b["equal"])
    print(f"{head}\n    ms/iter cpu {r['cpu']['steady_ms']:.3g} eager {r['eager']['steady_ms']:.3g} "
          f"adaptive {r['cold']['steady_ms']:.3g} (warm {r['warm']['steady_ms']:.3g})  "
          f"adaptive/eager {row['adaptive_vs_eager']:.2f}x (warm {row['warm_vs_eager']:.2f}x)  "
          f"adaptive/CPU {row['adaptive_vs_cpu']:.2f}x (warm {row['warm_vs_cpu']:.2f}x)\n"
          f"    warm-up first/early/steady ms: eager {fmt_curve(r['eager'])}  "
          f"cold {fmt_curve(r['cold'])}  warm {fmt_curve(r['warm'])}  "
          f"{'ok' if not row['warmup_violations'] else 'SLOW START'}  {bits}"
          + (f"\n    [noisy: other work kept {row['other_cores_busy']:.1f} cores busy]"
             if row["noisy"] else "")
          + ("\n    [the package was reinstalled between this cell's processes]"
             if len(row["builds"]) > 1 else ""), flush=True)


def summarize(rows: list[dict], seed: int) -> dict:
    good = [r for r in rows if "error" not in r]
    s = {"cells": len(rows), "failed": [r["name"] for r in rows if "error" in r]}
    if good:
        worst = min(good, key=lambda r: r["adaptive_vs_eager"])
        big = [r["adaptive_vs_eager"] for r in good if r["size"] > MIB]
        quiet = [r["adaptive_vs_eager"] for r in good if not r["noisy"]]
        s.update(
            noisy=[r["index"] for r in good if r["noisy"]],
            median_adaptive_vs_eager_quiet=statistics.median(quiet) if quiet else None,
            worst={"cell": worst["index"], "name": worst["name"],
                   "adaptive_vs_eager": worst["adaptive_vs_eager"]},
            worst_warm=min(r["warm_vs_eager"] for r in good),
            median_adaptive_vs_eager=statistics.median(r["adaptive_vs_eager"] for r in good),
            median_adaptive_vs_eager_over_1mib=statistics.median(big) if big else None,
            median_adaptive_vs_cpu=statistics.median(r["adaptive_vs_cpu"] for r in good),
            below_095=[r["index"] for r in good if r["adaptive_vs_eager"] < SLOW_RATIO],
            warmup_violations={r["index"]: r["warmup_violations"] for r in good
                               if r["warmup_violations"]},
            bit_mismatches=[{"seed": seed, "cell": r["index"], "name": r["name"],
                             "configs": {c: b["detail"] for c, b in r["bits"].items()
                                         if not b["equal"]}}
                            for r in good if not r["bit_equal"]])
    return s


def print_summary(s: dict, seed: int) -> None:
    print(f"\n== robust.py seed {seed}: {s['cells']} cells "
          f"({len(s['failed'])} failed{': ' + ', '.join(s['failed']) if s['failed'] else ''})")
    if "worst" not in s:
        return
    w = s["worst"]
    big = s["median_adaptive_vs_eager_over_1mib"]
    print(f"worst cell (adaptive/eager, cold): {w['adaptive_vs_eager']:.2f}x  "
          f"cell {w['cell']} ({w['name']}); worst warm {s['worst_warm']:.2f}x")
    print(f"median adaptive/eager {s['median_adaptive_vs_eager']:.2f}x; over cells > 1 MiB "
          f"{'n/a' if big is None else f'{big:.2f}x'}; median adaptive/CPU "
          f"{s['median_adaptive_vs_cpu']:.2f}x")
    print(f"cells below {SLOW_RATIO}: {len(s['below_095'])} {s['below_095']}")
    if s["noisy"]:
        q = s["median_adaptive_vs_eager_quiet"]
        print(f"noisy cells (other work kept > {NOISY_CORES} cores busy during a process): "
              f"{len(s['noisy'])} {s['noisy']}; median adaptive/eager without them "
              f"{'n/a' if q is None else f'{q:.2f}x'}")
    print(f"warm-up check (first/early window > {WARMUP_SLACK}x own steady or > eager's): "
          f"{len(s['warmup_violations'])} cells" + ("" if not s["warmup_violations"] else ":"))
    for i, v in s["warmup_violations"].items():
        print(f"    cell {i}: " + "; ".join(v))
    if s["bit_mismatches"]:
        for m in s["bit_mismatches"]:
            print(f"BIT MISMATCH seed {m['seed']} cell {m['cell']} ({m['name']}): {m['configs']}")
    else:
        print("every result equals CPU eager bit for bit")


def parse_list(p, text: str, what: str, conv, lo, hi, lo_text, hi_text) -> list:
    out = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        try:
            v = conv(item)
        except ValueError as e:
            p.error(f"--{what}: {e}")
        if not lo <= v <= hi:
            p.error(f"--{what}: {item!r} is out of range ({lo_text} to {hi_text})")
        out.append(v)
    if not out:
        p.error(f"--{what}: empty list")
    return out


def main():
    if sys.argv[1:2] == ["--child"]:
        return child(sys.argv[2])
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=0, help="program generator seed (default 0)")
    p.add_argument("--cells", type=int, default=None,
                   help=f"generated program cells (default {DEFAULT_CELLS}, --tiny 2)")
    p.add_argument("--sizes", default=DEFAULT_SIZES, help="tensor sizes, e.g. 16K,2M,64M")
    p.add_argument("--reads", default=DEFAULT_READS, help="host-read intervals, e.g. 1,100")
    p.add_argument("--workloads", default=",".join(WORKLOADS),
                   help="comma-separated subset of " + ",".join(WORKLOADS) + ", or none")
    p.add_argument("--only", default="", help="run only these cell indices (comma-separated)")
    p.add_argument("--tiny", action="store_true", help="CI smoke run: 3 small cells")
    p.add_argument("--list", action="store_true", help="print the cells and exit")
    p.add_argument("--timeout", type=float, default=1200, help="seconds per child process")
    p.add_argument("--json", default=None, help="write every figure here")
    args = p.parse_args()
    if args.seed < 0:
        p.error("--seed must be >= 0")
    args.sizes = parse_list(p, args.sizes, "sizes", parse_size, 16 * KIB, 256 * MIB, "16K", "256M")
    bad = [fmt_size(s) for s in args.sizes if s % (16 * KIB)]
    if bad:
        p.error(f"--sizes: {', '.join(bad)} is not a multiple of 16K")
    args.reads = parse_list(p, args.reads, "reads", int, 1, 1000, "1", "1000")
    names = [] if args.workloads.strip() == "none" else \
        [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = [w for w in names if w not in WORKLOADS]
    if unknown:
        p.error(f"--workloads: unknown {', '.join(unknown)} (allowed: {', '.join(WORKLOADS)}, none)")
    args.workloads = ["mlp"] if args.tiny and args.workloads == ",".join(WORKLOADS) else names
    if args.cells is None:
        args.cells = 2 if args.tiny else DEFAULT_CELLS
    if args.cells < 0:
        p.error("--cells must be >= 0")
    if not args.tiny and not any(r <= read_limit(s) for s in args.sizes for r in args.reads) \
            and args.cells:
        p.error("--sizes/--reads: no combination allowed (reads above 10 need sizes below "
                "8M, reads above 1 sizes below 32M)")
    cells = build_cells(args)
    if args.only:
        try:
            wanted = {int(i) for i in args.only.split(",") if i.strip()}
        except ValueError:
            p.error(f"--only: {args.only!r} is not a comma-separated list of cell indices")
        missing = sorted(wanted - {c["index"] for c in cells})
        if missing:
            p.error(f"--only: no cell {missing} (this run has cells 0 to {len(cells) - 1})")
        cells = [c for c in cells if c["index"] in wanted]
    if not cells:
        p.error("nothing to run (--cells 0 and --workloads none)")

    if args.list:
        for c in cells:
            p_ = c["plan"]
            print(f"cell {c['index']}: {c['name']}  iterations {p_['iters']} (windows "
                  f"{p_['w1']}, {p_['w2']}, blocks of {p_['block']})")
            if "program" in c:
                print("    " + " ".join(o["op"] for o in c["program"]["ops"]))
        return 0

    import torch

    threads = torch.get_num_threads()
    print(f"robust.py seed {args.seed}: {len(cells)} cells x {len(CONFIGS)} processes "
          f"({', '.join(CONFIGS)}), {threads} threads; ratios are steady ms/iter of the "
          f"other config over adaptive's (> 1: adaptive faster)", flush=True)
    # SIGTERM unwinds like Ctrl-C: the running child is killed, the work folder removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = tempfile.mkdtemp(prefix="robust_")
    rows = []
    t0 = time.perf_counter()
    try:
        for cell in cells:
            rows.append(run_cell(cell, work, args))
            print_row(rows[-1], len(cells))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    s = summarize(rows, args.seed)
    s["wall_s"] = time.perf_counter() - t0
    print_summary(s, args.seed)
    print(f"({s['wall_s'] / 60:.1f} min)")
    write_json(args.json, {"seed": args.seed, "tiny": args.tiny, "threads": threads,
                           "sizes": args.sizes, "reads": args.reads, "summary": s,
                           "cells": rows})
    return 1 if s["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
