"""Runs one suite workload in steady state for profiling: warm-up, then --steps steps,
optionally under a neuron trace recording (--trace), printing where the time went by the
engine's counters. Run it under perf to see host costs:

    perf record -g -o perf.data -- python bench/python/profile_workload.py chain_small \
        --config adaptive --steps 2000 --warmup 20
    python bench/python/profile_workload.py mlp_train --trace /tmp/mlp.ntrace
    neuron-trace summary /tmp/mlp.ntrace
"""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from suite_worker import config_setup, settle_adaptive  # noqa: E402
from suite_workloads import all_workloads  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workload")
    p.add_argument("--config", default="adaptive", choices=("cpu", "eager", "adaptive", "compile"))
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--sync-every", type=int, default=1,
                   help="synchronize after every N steps (0: only at the end)")
    p.add_argument("--trace", default=None, help="record the timed steps to this trace file")
    args = p.parse_args()
    wl = {w.name: w for w in all_workloads(args.tiny)}[args.workload]
    device, compiled, sync = config_setup(args.config, "inductor")
    run = wl.make(device, compiled)
    def steps(n):
        for i in range(n):
            run.step()
            if args.sync_every and (i + 1) % args.sync_every == 0:
                sync()
        sync()

    steps(args.warmup)
    if args.config == "adaptive":
        settle_adaptive(run, sync, [])  # background builds done, as in the suite
    neuron = device == "neuron"
    if neuron:
        import neuron_eager
        neuron_eager.reset_counters()
    recording = None
    if args.trace:
        import neuron_eager.trace as nt
        recording = nt.start(args.trace) if hasattr(nt, "start") else None
    t = time.perf_counter()
    steps(args.steps)
    elapsed = time.perf_counter() - t
    if recording is not None:
        import neuron_eager.trace as nt
        print(nt.stop())
    print(f"{args.workload} / {args.config}: {elapsed / args.steps * 1e3:.3f} ms per step "
          f"over {args.steps} steps")
    if neuron:
        c = neuron_eager.counters()
        per_step = {k: v / args.steps for k, v in c.items() if v}
        print("counters per step:", {k: round(v, 2) for k, v in per_step.items()})


if __name__ == "__main__":
    main()
