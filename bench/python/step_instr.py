"""Instructions per step on the host thread for one suite workload, config against config,
counted by valgrind's callgrind: exact and repeatable where this VM's wall times drift by
30% or more between runs (llama_decode's neuron eager step took 206 and 380 ms within an
hour here). For host-bound workloads (decoding) it shows what adaptive mode's bookkeeping
costs the dispatching thread over neuron eager.

Each config runs in a child under callgrind with instrumentation off; after the warm-up
(and, for adaptive, once its programs and tier-2 trials have settled) instrumentation is
on for exactly --steps steps, each ending with a sync, and off again.

    python bench/python/step_instr.py llama_decode eager adaptive [--steps 1] [--json out.json]

Under callgrind a program runs 50-100x slower: a decode step of 64 tokens takes about
4 minutes (eager) to 7 (adaptive, which settles first).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_common import (callgrind_measure, gate_signal_and_wait, require_callgrind,  # noqa: E402
                          write_json)

CONFIGS = ("cpu", "eager", "adaptive")


def child(workload: str, config: str, steps: int, tiny: bool, gate: str) -> None:
    import torch  # noqa: F401
    from suite_worker import config_setup, settle_adaptive, timed
    from suite_workloads import all_workloads

    wl = {w.name: w for w in all_workloads(tiny)}[workload]
    device, compiled, sync = config_setup(config, None)
    run = wl.make(device, compiled)
    warm = [timed(run.step, sync) for _ in range(3)]
    if config == "adaptive":
        settle_adaptive(run, sync, warm)
    gate_signal_and_wait(gate, "ready", "on")
    for _ in range(steps):
        run.step()
        sync()
    gate_signal_and_wait(gate, "done", "off")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workload")
    p.add_argument("configs", nargs="+", choices=CONFIGS)
    p.add_argument("--steps", type=int, default=1)
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--json", default=None)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--gate", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.steps < 1:
        raise SystemExit(f"--steps must be at least 1, got {args.steps}")
    if args.child:
        child(args.workload, args.child, args.steps, args.tiny, args.gate)
        return
    from suite_workloads import all_workloads

    names = [w.name for w in all_workloads(args.tiny)]
    if args.workload not in names:
        raise SystemExit(f"unknown workload {args.workload!r}; one of: {', '.join(names)}")
    require_callgrind("step_instr.py")
    res = {"workload": args.workload, "steps": args.steps, "configs": {}}
    with tempfile.TemporaryDirectory() as work:
        for config in args.configs:
            gate = os.path.join(work, config)
            argv = [os.path.abspath(__file__), args.workload, config, "--steps", str(args.steps),
                    "--child", config, "--gate", gate] + (["--tiny"] if args.tiny else [])
            totals = callgrind_measure(argv, os.path.join(work, f"cg_{config}"), gate)
            res["configs"][config] = {
                "host_instructions_per_step": totals.get(1, 0) / args.steps,
                "other_threads_instructions_per_step":
                    sum(v for k, v in totals.items() if k != 1) / args.steps}
    first = args.configs[0]
    base = res["configs"][first]["host_instructions_per_step"]
    print(f"{args.workload}: instructions per step (callgrind, {args.steps} steps), "
          f"host thread against {first}:")
    for config, r in res["configs"].items():
        r["host_ratio"] = r["host_instructions_per_step"] / base if base else 0.0
        print(f"  {config:9s} host thread {r['host_instructions_per_step'] / 1e6:9.1f} M  "
              f"({r['host_ratio']:.3f}x)   other threads "
              f"{r['other_threads_instructions_per_step'] / 1e6:9.1f} M")
    write_json(args.json, res)


if __name__ == "__main__":
    main()
