"""What bounds a neuron config on this machine: the host's share of a step, and the
device's.

A `neuron` step returns once its ops are queued; the device (worker threads on the same
CPU) runs them meanwhile. However fast the device were, a step could not take less than
the host's time to dispatch it (Python, autograd, the dispatcher, our recording and
queueing). So CPU eager time / host time is the best speedup over CPU eager a neuron
config can reach with this Python code on this machine: the ceiling the issue-6 targets
are read against. For each workload of the suite, in one process per config:

- CPU eager: the median step;
- neuron eager / adaptive: the median step (with a sync), the median host part of it
  (time until step() returned; the queue stays below the backpressure limit), and the
  device's tail (the wait at the sync, work the host did not overlap), and the device's
  busy time per step (the workers running items: neuron_eager.counters()["device_busy_ns"]);
- ceiling = CPU eager step / host part; device ceiling = CPU eager step / device busy
  time. A step can beat neither: where the device ceiling is the lower, the kernels as
  the worker runs them (their thread counts while the host holds a core included) bound
  the workload, not the host.

    python bench/python/host_bound.py [--only mlp_train,adamw] [--tiny] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_common import write_json  # noqa: E402


def measure(name, config, tiny, steps, warmup):
    import torch
    from suite_worker import config_setup
    from suite_workloads import all_workloads

    wl = {w.name: w for w in all_workloads(tiny)}[name]
    device, _, sync = config_setup(config, None)
    run = wl.make(device, None)
    for _ in range(warmup):
        run.step()
        sync()
    busy0 = device_busy_ns(device)
    host, total = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        run.step()
        t1 = time.perf_counter()
        sync()
        t2 = time.perf_counter()
        host.append(t1 - t0)
        total.append(t2 - t0)
    del torch
    out = {"step_ms": 1e3 * statistics.median(total), "host_ms": 1e3 * statistics.median(host)}
    if device != "cpu":
        out["device_busy_ms"] = (device_busy_ns(device) - busy0) / 1e6 / steps
        out["step_mean_ms"] = 1e3 * statistics.mean(total)
    return out


def device_busy_ns(device):
    """The neuron workers' busy time so far (running items), from the engine's counters."""
    if device == "cpu":
        return 0
    import neuron_eager
    return neuron_eager.counters()["device_busy_ns"]


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="", help="comma-separated workload names")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--json", default=None)
    p.add_argument("--worker", nargs=2, metavar=("WORKLOAD", "CONFIG"), help=argparse.SUPPRESS)
    args = p.parse_args()
    steps = args.steps or (3 if args.tiny else 30)
    warmup = args.warmup or (3 if args.tiny else 10)
    if args.worker:
        print(json.dumps(measure(*args.worker, args.tiny, steps, warmup)))
        return
    from suite_workloads import all_workloads

    names = [w.name for w in all_workloads(args.tiny) if w.kind != "warmup"]
    if args.only:
        names = [n for n in names if n in args.only.split(",")]
    rows = {}
    for name in names:
        row = {}
        for config in ("cpu", "eager", "adaptive"):
            cmd = [sys.executable, __file__, "--worker", name, config, "--steps", str(steps),
                   "--warmup", str(warmup)] + (["--tiny"] if args.tiny else [])
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
            if r.returncode != 0:
                raise SystemExit(f"{name} / {config} failed:\n{r.stderr[-2000:]}")
            row[config] = json.loads(r.stdout.strip().splitlines()[-1])
        cpu = row["cpu"]["step_ms"]
        for config in ("eager", "adaptive"):
            f = row[config]
            f["device_tail_ms"] = f["step_ms"] - f["host_ms"]
            f["speedup_vs_cpu"] = cpu / f["step_ms"]
            f["ceiling_vs_cpu"] = cpu / f["host_ms"]
            f["device_ceiling_vs_cpu"] = cpu / f["device_busy_ms"]
        rows[name] = row
    head = ("workload", "CPU ms", "eager ms", "eager host", "adaptive ms", "adaptive host",
            "adaptive tail", "adaptive device", "adaptive/CPU", "ceiling/CPU", "device ceiling/CPU")
    print(" | ".join(head))
    for name, row in rows.items():
        e, a = row["eager"], row["adaptive"]
        print(f"{name} | {row['cpu']['step_ms']:.3f} | {e['step_ms']:.3f} | {e['host_ms']:.3f} | "
              f"{a['step_ms']:.3f} | {a['host_ms']:.3f} | {a['device_tail_ms']:.3f} | "
              f"{a['device_busy_ms']:.3f} | {a['speedup_vs_cpu']:.2f}x | {a['ceiling_vs_cpu']:.2f}x | "
              f"{a['device_ceiling_vs_cpu']:.2f}x")
    write_json(args.json, rows, indent=1)


if __name__ == "__main__":
    main()
