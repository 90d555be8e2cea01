"""Does time per iteration or memory grow with how far the host runs ahead of the device?

A six-op pointwise chain on one 2048x2048 fp32 tensor (tanh, mul, add, sigmoid, mul, sub:
each iteration reads the same input and makes fresh 16 MiB intermediates), with a host
read (`.item()` of one element of the result) every 1, 50 or 500 iterations: the host
queues up to that many iterations before it waits (the engine's backpressure permitting).
Each (mode, read interval) runs in its own fresh process: a warm-up of 50 iterations
rounded up to a multiple of the read interval, then `--iters` timed ones (a multiple of
every read interval). Per process: ms per iteration, peak RSS (VmHWM from
/proc/self/status, which includes the ~0.25 GiB of torch itself; the growth over the RSS
before the loop is printed too), and the device's max_memory_allocated and peak reserved bytes. Then, per mode, the ratios
every-N / every-1 for time and peak RSS; the issue-21 target is every-500 within 10% of
every-1 for both. CPU eager (plain PyTorch, neuron not loaded) runs with a read every
iteration as a reference.

    python bench/python/queue_depth.py                      # eager and adaptive, ~8 min
    python bench/python/queue_depth.py --modes eager --reads 1,50 --iters 500
    python bench/python/queue_depth.py --tiny --json out.json   # CI: 256x256, ~30 s

A run with reads every 500 can hold up to NEURON_HBM_BYTES (8 GiB by default) of queued
intermediates while the allocator keeps freed blocks until the work queued before their
free has run; the machine needs that much free memory.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_common import write_json  # noqa: E402
from robust_report import NOISY_CORES  # noqa: E402
from robust_runs import run_measured  # noqa: E402

MODES = ("eager", "adaptive")
GIB = 1024 ** 3
MIB = 1024 ** 2


def status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def child(mode: str, size: int, reads: int, warmup: int, iters: int) -> None:
    import resource

    import torch

    device = "cpu" if mode == "cpu" else "neuron"
    x = torch.randn(size, size, generator=torch.Generator().manual_seed(0)).to(device)

    def chain():
        y = torch.tanh(x)
        y = y * 1.5
        y = y + x
        y = torch.sigmoid(y)
        y = y * x
        return y - 0.25

    def loop(n):
        vals = []
        for i in range(n):
            y = chain()
            if (i + 1) % reads == 0:
                vals.append(y[0, 0].item())
        return vals

    # Every op once and a read before the baseline, so lazy imports and the first
    # allocations are not counted as growth.
    chain()[0, 0].item()
    rss0 = status_bytes("VmRSS")
    loop(warmup)
    t = time.perf_counter()
    vals = loop(iters)
    ms = (time.perf_counter() - t) / iters * 1e3
    out = {"ms_per_iter": ms, "peak_rss": status_bytes("VmHWM"), "rss_before_loop": rss0,
           "ru_maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
           "last_read": vals[-1]}
    if device != "cpu":
        import neuron_eager

        assert neuron_eager.get_mode() == mode
        stats = torch.neuron.memory_stats()
        out.update(max_memory_allocated=torch.neuron.max_memory_allocated(),
                   peak_reserved=stats["reserved_bytes.all.peak"],
                   alloc_retries=stats["num_alloc_retries"])
    print("RESULT " + json.dumps(out), flush=True)


def run_child(mode, size, reads, warmup, iters, timeout):
    env = dict(os.environ)
    if mode == "cpu":
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    else:
        env["NEURON_EAGER_MODE"] = mode
    cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, str(size), str(reads),
           str(warmup), str(iters)]
    try:
        proc, wall, others = run_measured(cmd, env, timeout)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timed out after {timeout:.0f} s"}
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        return {"ok": False, "error": (proc.stderr or proc.stdout)[-1500:].strip()}
    return {"ok": True, "wall_s": wall, "other_cores_busy": others,
            **json.loads(lines[-1][len("RESULT "):])}


def fmt_bytes(n):
    if n >= GIB:
        return f"{n / GIB:.2f} GiB"
    return f"{n / MIB:.0f} MiB" if n >= 10 * MIB else f"{n / 1024:.0f} KiB"


def main():
    if sys.argv[1:2] == ["--child"]:
        mode, size, reads, warmup, iters = sys.argv[2:7]
        return child(mode, int(size), int(reads), int(warmup), int(iters))
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", default="eager,adaptive", help="eager, adaptive or both")
    p.add_argument("--reads", default="1,50,500", help="host-read intervals; the first is "
                   "the baseline of the ratios")
    p.add_argument("--size", type=int, default=2048, help="the tensor is SIZE x SIZE fp32")
    p.add_argument("--iters", type=int, default=1000, help="timed iterations per process")
    p.add_argument("--no-cpu", action="store_true", help="skip the CPU eager reference")
    p.add_argument("--tiny", action="store_true", help="CI: 256x256, reads 1,10,50, 100 iters")
    p.add_argument("--timeout", type=float, default=900, help="seconds per child process")
    p.add_argument("--json", default=None, help="write the figures here")
    args = p.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        p.error(f"--modes: {args.modes!r}: allowed eager, adaptive (comma-separated)")
    if args.tiny:
        args.size, args.iters = 256, 100
        if args.reads == "1,50,500":
            args.reads = "1,10,50"
    try:
        reads = [int(r) for r in args.reads.split(",") if r.strip()]
    except ValueError:
        p.error(f"--reads: {args.reads!r} is not a comma-separated list of integers")
    if not reads or any(r < 1 for r in reads):
        p.error(f"--reads: {args.reads!r}: intervals must be integers >= 1")
    if args.size < 2 or args.size > 16384:
        p.error(f"--size {args.size}: allowed 2 to 16384")
    not_multiple = [r for r in reads if args.iters % r]
    if args.iters < 1 or not_multiple:
        p.error(f"--iters {args.iters}: must be a positive multiple of every read interval "
                f"({', '.join(map(str, not_multiple))} does not divide it)")

    results = {}
    print(f"six-op pointwise chain on {args.size}x{args.size} fp32 "
          f"({fmt_bytes(args.size * args.size * 4)} per tensor), {args.iters} timed iterations "
          f"per process", flush=True)
    jobs = ([] if args.no_cpu else [("cpu", reads[0])]) + [(m, r) for m in modes for r in reads]
    retries = []
    for mode, r in jobs:
        res = run_child(mode, args.size, r, -(-50 // r) * r, args.iters, args.timeout)
        if not res["ok"]:
            # Once more, so one crashed child does not void the table; the first error is
            # kept in the JSON ("retries") and printed.
            retries.append({"mode": mode, "reads": r, "error": res["error"]})
            print(f"  {mode:8s} read every {r:4d}: child failed, running it again: "
                  f"{res['error'][-800:]}", flush=True)
            res = run_child(mode, args.size, r, -(-50 // r) * r, args.iters, args.timeout)
        results.setdefault(mode, {})[r] = res
        if not res["ok"]:
            print(f"  {mode:8s} read every {r:4d}: ERROR {res['error'][-800:]}", flush=True)
            continue
        extra = "" if mode == "cpu" else (
            f"  max_memory_allocated {fmt_bytes(res['max_memory_allocated'])}"
            f"  peak reserved {fmt_bytes(res['peak_reserved'])}")
        print(f"  {mode:8s} read every {r:4d}: {res['ms_per_iter']:8.2f} ms/iter  "
              f"peak RSS {fmt_bytes(res['peak_rss'])} "
              f"(+{fmt_bytes(res['peak_rss'] - res['rss_before_loop'])} over the loop){extra}"
              + (f"  [noisy: other work kept {res['other_cores_busy']:.1f} cores busy]"
                 if res["other_cores_busy"] > NOISY_CORES else ""), flush=True)
    ratios = {}
    base = reads[0]
    for mode in modes:
        b = results[mode][base]
        if not b["ok"]:
            continue
        for r in reads[1:]:
            res = results[mode][r]
            if not res["ok"]:
                continue
            t = res["ms_per_iter"] / b["ms_per_iter"]
            rss = res["peak_rss"] / b["peak_rss"]
            ratios.setdefault(mode, {})[r] = {"time": t, "peak_rss": rss}
            verdict = "within 10%" if t <= 1.1 and rss <= 1.1 else "NOT within 10%"
            print(f"{mode}: every {r} / every {base}: time {t:.2f}x, peak RSS {rss:.2f}x "
                  f"({verdict})")
    failed = [f"{m} every {r}" for m, d in results.items() for r, res in d.items()
              if not res["ok"]]
    write_json(args.json, {"size": args.size, "iters": args.iters, "reads": reads,
                           "results": {m: {str(r): v for r, v in d.items()}
                                       for m, d in results.items()},
                           "ratios": {m: {str(r): v for r, v in d.items()}
                                      for m, d in ratios.items()},
                           "failed": failed, "retries": retries})
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
