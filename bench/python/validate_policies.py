"""Validates offline replay against real runs: for each benchmark workload, record one
trace (adaptive mode, the reference policy), replay it under every built-in policy, run
the workload for real under each policy, and report predicted vs measured device time
(target: within 20%) and whether replaying each real run under its own policy reproduces
its decisions exactly.

    python bench/python/validate_policies.py [--steps 30] [--tiny] [--json out.json]

Every run is a fresh process (empty segment cache), recording from before the first op.
Device time is what the trace measured: fused segments plus ops run on their own. Before
measuring, one unrecorded run per policy fills the tier-2 disk cache (otherwise whichever
run comes first pays for background compiles), and the reference and each real run are
repeated (--repeats): on a shared machine one run's device time can be several times
another's. The fastest run stands for each configuration, the reference recording
included (--stat min: other work on the machine only ever adds time; --stat median is
the alternative). The repeats run in rounds (reference, then each policy, in a rotated
order) so that slow and fast periods of the machine fall on both sides alike.
"""

import argparse
import json
import statistics
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
POLICIES = ("default", "aggressive", "conservative", "never")


def workloads(tiny):
    sys.path.insert(0, HERE)
    import adaptive as bench  # the workload code of bench/python/adaptive.py
    if tiny:
        return {"ln_gelu_chain": bench.chain_workload(8, 32), "mlp_step": bench.mlp_workload(4, 16),
                "adamw_step": bench.adamw_workload(4, (8, 8))}
    return {"ln_gelu_chain": bench.chain_workload(256, 1024), "mlp_step": bench.mlp_workload(64, 256),
            "adamw_step": bench.adamw_workload(20, (128, 128))}


def worker(args):
    import torch
    import neuron_eager
    import neuron_eager.trace as nt
    neuron_eager.set_mode("adaptive")
    neuron_eager.set_policy(args.policy)
    make = workloads(args.tiny)[args.workload]
    t0 = time.perf_counter()
    if args.trace == "-":  # warm-up: fills the tier-2 cache, waits for its compiles
        step = make("neuron")
        for _ in range(args.steps):
            step()
            torch.neuron.synchronize()
        if hasattr(neuron_eager._C, "native_wait_idle"):
            neuron_eager._C.native_wait_idle()
    else:
        with nt.record(args.trace, metadata={"workload": args.workload, "steps": args.steps}):
            step = make("neuron")
            for _ in range(args.steps):
                step()
                torch.neuron.synchronize()
    print(json.dumps({"wall_s": time.perf_counter() - t0}))


def run_worker(workload, policy, steps, trace, tiny):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", workload, "--policy", policy,
           "--steps", str(steps), "--trace", trace] + (["--tiny"] if tiny else [])
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--tiny", action="store_true", help="tiny sizes (smoke run)")
    p.add_argument("--reference", default="default", help="policy of the recorded trace")
    p.add_argument("--cost-model", default="measured", choices=("measured", "trn2"))
    p.add_argument("--workloads", nargs="*", help="subset of workloads")
    p.add_argument("--json", default=None)
    p.add_argument("--repeats", type=int, default=3, help="runs per measurement")
    p.add_argument("--stat", default="min", choices=("min", "median"),
                   help="which run stands for a configuration: the fastest (other work on "
                        "the machine only ever adds time) or the median")
    p.add_argument("--keep", default=None, help="folder to keep the traces in")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--policy", default="default", help=argparse.SUPPRESS)
    p.add_argument("--trace", help=argparse.SUPPRESS)
    p.add_argument("--workload", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        args.workload = args.worker
        return worker(args)

    from neuron_eager.trace import load
    from neuron_eager.trace import replay as rp
    folder = args.keep or tempfile.mkdtemp(prefix="validate-policies-")
    os.makedirs(folder, exist_ok=True)
    names = args.workloads or list(workloads(args.tiny))
    results = {}
    print(f"{'workload':14s} {'policy':13s} {'predicted ms':>12s} {'measured ms':>11s} "
          f"{'error':>7s} {'pred comp':>9s} {'real comp':>9s} {'pred hit':>8s} {'real hit':>8s} "
          f"{'reproduced':>10s}")
    for name in names:
        for policy in POLICIES:
            run_worker(name, policy, args.steps, "-", args.tiny)
        # Rounds: each records the reference and runs every policy once, in a rotated
        # order, so that a slow minute of the shared machine lands on the reference and
        # the real runs alike instead of on one side of the comparison.
        refs, real_runs = [], {policy: [] for policy in POLICIES}
        for k in range(args.repeats):
            ref = os.path.join(folder, f"{name}-recorded-{args.reference}-{k}.ntrace")
            order = [None] + list(POLICIES)
            order = order[k % len(order):] + order[:k % len(order)]
            for policy in order:
                if policy is None:
                    run_worker(name, args.reference, args.steps, ref, args.tiny)
                    refs.append((rp.measured_device_ns(load(ref)), ref))
                    continue
                real = os.path.join(folder, f"{name}-{policy}-{k}.ntrace")
                wall = run_worker(name, policy, args.steps, real, args.tiny)
                real_trace = load(real)
                real_runs[policy].append((rp.measured_device_ns(real_trace), real_trace, wall))
        # The reference: the fastest (or median) recording by measured device time.
        pick = (lambda n: 0) if args.stat == "min" else (lambda n: n // 2)
        ref = sorted(refs)[pick(len(refs))][1]
        prepared = rp.prepare(ref)
        results[name] = {}
        for policy in POLICIES:
            predicted = rp.replay(prepared, policy, args.cost_model)
            runs = real_runs[policy]
            measured, real_trace, wall = sorted(runs, key=lambda r: r[0])[pick(len(runs))]
            repro = [rp.check_reproduction(r[1]) for r in runs]
            real_rep = repro[0]["report"]
            err = (predicted.device_ns - measured) / measured if measured else float("nan")
            row = {"predicted_ms": predicted.device_ns / 1e6, "measured_ms": measured / 1e6,
                   "measured_runs_ms": [r[0] / 1e6 for r in runs],
                   "error": err, "predicted_compiles": predicted.compiles,
                   "real_compiles": repro[0]["compiled_recorded"],
                   "predicted_hit_rate": predicted.hit_rate, "real_hit_rate": real_rep.hit_rate,
                   "reproduced_exactly": all(r["exact"] for r in repro),
                   "occurrences": repro[0]["occurrences"],
                   "wall_s": wall["wall_s"], "replay_s": predicted.replay_s}
            results[name][policy] = row
            print(f"{name:14s} {policy:13s} {row['predicted_ms']:12.3f} {row['measured_ms']:11.3f} "
                  f"{err:+7.1%} {row['predicted_compiles']:9d} {row['real_compiles']:9d} "
                  f"{row['predicted_hit_rate']:8.1%} {row['real_hit_rate']:8.1%} "
                  f"{str(row['reproduced_exactly']):>10s}  runs "
                  + " ".join(f"{m:.1f}" for m in row["measured_runs_ms"]), flush=True)
    errors = [abs(r["error"]) for w in results.values() for r in w.values()]
    print(f"max |error| {max(errors):.1%}; within 20%: {sum(e <= 0.2 for e in errors)}/{len(errors)}; "
          f"traces in {folder}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"steps": args.steps, "reference": args.reference, "stat": args.stat,
                       "cost_model": args.cost_model, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
