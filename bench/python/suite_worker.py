"""Runs suite workloads under one config in this process and writes one JSON file of
figures (plus CPU copies of the results, for the correctness check). suite.py starts one
of these per (workload, config), or per config with --isolate config.

    python bench/python/suite_worker.py --config adaptive --workloads chain_small,adamw \
        --out DIR [--tiny] [--repeats 7]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from suite_workloads import all_workloads  # noqa: E402

CONFIGS = ("cpu", "eager", "adaptive", "compile", "compile_neuron")
CHECK_STEPS = 2  # steps run before results are compared with CPU eager


def config_setup(config, compile_backend):
    """(device, torch.compile backend or None, sync) for a config name. compile_neuron:
    torch.compile(backend="neuron") on neuron in eager mode (its graphs fuse as compiled
    regions; ops outside them run per op)."""
    if config in ("cpu", "compile"):
        return "cpu", compile_backend if config == "compile" else None, lambda: None
    import neuron_eager

    if config == "compile_neuron":
        neuron_eager.set_mode("eager")
        return "neuron", "neuron", torch.neuron.synchronize
    neuron_eager.set_mode(config)
    return "neuron", None, torch.neuron.synchronize


def timed(fn, sync):
    t = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t


def steady_point(times, steady, window=5, slack=1.25):
    """Index of the first step that runs at steady-state speed (within `slack`), as does
    the median of the `window` steps from it."""
    for i in range(len(times)):
        if times[i] <= slack * steady and statistics.median(times[i:i + window]) <= slack * steady:
            return i
    return len(times)


def run_warmup(run, sync, tiny, times):
    """Times every call from the first (`times` holds the calls made so far): time to
    steady state and the excess over steady-state speed spent getting there."""
    min_steps, min_s = (12, 0.0) if tiny else (60, 4.0)
    times = list(times)
    while len(times) < min_steps or sum(times) - times[0] < min_s:
        times.append(timed(run.step, sync))
    steady = statistics.median(times[-20:])
    i = steady_point(times, steady)
    return {"median_ms": steady * 1e3, "min_ms": min(times[-20:]) * 1e3,
            "max_ms": max(times[-20:]) * 1e3, "first_call_ms": times[0] * 1e3,
            "steps": len(times), "steady_after_steps": i,
            "time_to_steady_s": sum(times[:i]), "warmup_excess_s": sum(times[:i]) - i * steady,
            "per_call_ms": [t * 1e3 for t in times]}


def settle_adaptive(run, sync, warm):
    """Adaptive mode's steady state: its background tier-2 builds finished and their
    trials (3 runs each against tier 1) done, as torch.compile's steady state follows its
    compile. How long that takes from the first call is the warm-up workload's figure."""
    import neuron_eager

    neuron_eager._C.native_wait_idle()
    for _ in range(6):
        warm.append(timed(run.step, sync))


def run_steady(wl, run, sync, tiny, repeats, adaptive=False):
    warm = []
    if wl.fixed_inner:
        for _ in range(3):
            warm.append(timed(run.step, sync))
        if adaptive:
            settle_adaptive(run, sync, warm)
        inner = wl.fixed_inner
    else:
        min_steps, min_s = (3, 0.0) if tiny else (5, 1.0)
        t0 = time.perf_counter()
        while len(warm) < min_steps or time.perf_counter() - t0 < min_s:
            warm.append(timed(run.step, sync))
        if adaptive:
            settle_adaptive(run, sync, warm)
        per_step = statistics.median(warm[-3:])
        target = 0.002 if tiny else 0.05  # seconds per timed repeat
        inner = max(1, min(1000, math.ceil(target / max(per_step, 1e-7))))
    # Every step ends with a sync, as in warm-up (and as a loop reading its loss does): in
    # adaptive mode a sync is a segment boundary, so a loop without one segments by
    # content alone and may fuse less (see profile_workload.py --sync-every).
    samples = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(inner):
            run.step()
            sync()
        samples.append((time.perf_counter() - t) / inner)
    return {"median_ms": statistics.median(samples) * 1e3, "min_ms": min(samples) * 1e3,
            "max_ms": max(samples) * 1e3, "warmup_steps": len(warm), "inner": inner, "repeats": repeats,
            "samples_ms": [s * 1e3 for s in samples]}


def run_one(wl, config, args):
    device, compiled, sync = config_setup(config, args.compile_backend)
    if compiled:
        torch._dynamo.reset()
    counters = None
    if config in ("adaptive", "compile_neuron"):
        import neuron_eager
        neuron_eager.reset_counters()
    run = wl.make(device, compiled)
    # Results after CHECK_STEPS steps from the seed: the same in every config. The first
    # call's time (compile included) is kept by the timers below.
    t0 = time.perf_counter()
    step_times = [timed(run.step, sync) for _ in range(CHECK_STEPS)]
    early = run.result()
    if wl.kind == "warmup":
        # The warm-up clock starts at the first call: keep the check steps' times.
        fig = run_warmup(run, sync, args.tiny, step_times)
    else:
        # compile(neuron)'s tier-2 kernels come from the background as adaptive mode's do:
        # both are timed once those builds are done (a build takes one of the two cores).
        fig = run_steady(wl, run, sync, args.tiny, args.repeats,
                         adaptive=config in ("adaptive", "compile_neuron"))
        fig["first_call_ms"] = step_times[0] * 1e3
        fig["second_call_ms"] = step_times[1] * 1e3
    fig["wall_s"] = time.perf_counter() - t0
    if config in ("adaptive", "compile_neuron"):
        import neuron_eager
        counters = neuron_eager.counters()
        fused, per_op = counters["ops_in_fused_segments"], counters["ops_per_op"]
        fig["fused_share"] = fused / max(1, fused + per_op)
        fig["counters"] = counters
    checks = {"early": early}
    if not compiled and wl.kind != "shapes":
        # A fresh copy run while the caches are hot: in adaptive mode these steps take
        # the fused path, so a fast wrong answer shows here.
        hot = wl.make(device, compiled)
        for _ in range(CHECK_STEPS):
            hot.step()
        sync()
        checks["hot"] = hot.result()
    torch.save(checks, os.path.join(args.out, "check", f"{wl.name}__{config}.pt"))
    return fig


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--config", choices=CONFIGS, required=True)
    p.add_argument("--workloads", required=True, help="comma-separated names")
    p.add_argument("--out", required=True)
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--compile-backend", default="inductor")
    args = p.parse_args()
    for sub in ("check", "raw"):
        os.makedirs(os.path.join(args.out, sub), exist_ok=True)
    wanted = args.workloads.split(",")
    workloads = {w.name: w for w in all_workloads(args.tiny)}
    for name in wanted:
        result = {"workload": name, "config": args.config, "threads": torch.get_num_threads()}
        if args.config in ("compile", "compile_neuron"):
            result["compile_backend"] = "neuron" if args.config == "compile_neuron" else args.compile_backend
        try:
            result.update(run_one(workloads[name], args.config, args))
            result["ok"] = True
        except Exception as e:  # reported in the table as ERR, the suite goes on
            result.update(ok=False, error=f"{type(e).__name__}: {e}",
                          traceback=traceback.format_exc()[-4000:])
        with open(os.path.join(args.out, "raw", f"{name}__{args.config}.json"), "w") as f:
            json.dump(result, f, indent=1)
        status = "ok" if result["ok"] else "ERROR " + result["error"][:200]
        print(f"[worker] {name} / {args.config}: {status}", flush=True)


if __name__ == "__main__":
    main()
