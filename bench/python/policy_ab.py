"""A/B of fusion policies inside one process: on a noisy machine, separate processes
differ by more than the policies do. Alternates the policies in blocks (fusion state
reset, warm-up, then timed steps), several rounds, and prints per policy the median and
the minimum of the per-block step times, with `eager` (neuron eager) as a reference
when asked for.

    python bench/python/policy_ab.py chain_cache "min_group_elements=65536" \
        "min_group_elements=1000000000" eager --rounds 5 --steps 50

Each policy is `key=value[,key=value...]` over the default policy, a built-in policy
name, or `eager`.
"""

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from suite_workloads import all_workloads  # noqa: E402


def parse(spec):
    if spec == "eager":
        return None
    if "=" not in spec:
        return spec  # a built-in name or a policy file
    out = {}
    for item in spec.split(","):
        key, _, value = item.partition("=")
        out[key.strip()] = value.strip()
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workload")
    p.add_argument("policies", nargs="+")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--tiny", action="store_true")
    args = p.parse_args()
    import neuron_eager

    workloads = {w.name: w for w in all_workloads(args.tiny)}
    if args.workload not in workloads:
        sys.exit(f"policy_ab: unknown workload '{args.workload}'; allowed: {', '.join(workloads)}")
    wl = workloads[args.workload]
    for spec in args.policies:  # every policy valid before anything runs
        try:
            neuron_eager.set_policy("default" if parse(spec) is None else parse(spec))
        except (ValueError, TypeError, RuntimeError) as e:
            sys.exit(f"policy_ab: policy '{spec}': {e}")
    neuron_eager.set_mode("adaptive")
    run = wl.make("neuron", None)
    sync = torch.neuron.synchronize
    times = {spec: [] for spec in args.policies}
    for r in range(args.rounds):
        order = args.policies[r % len(args.policies):] + args.policies[:r % len(args.policies)]
        for spec in order:
            policy = parse(spec)
            neuron_eager.set_mode("eager" if policy is None else "adaptive")
            neuron_eager.reset_fusion_state()
            neuron_eager.set_policy("default" if policy is None else policy)
            for _ in range(args.warmup):
                run.step()
                sync()
            neuron_eager._C.native_wait_idle()
            for _ in range(3):
                run.step()
                sync()
            t = time.perf_counter()
            for _ in range(args.steps):
                run.step()
                sync()
            times[spec].append((time.perf_counter() - t) / args.steps * 1e3)
    base = statistics.median(times[args.policies[0]])
    print(f"{args.workload}: ms per step over {args.rounds} blocks of {args.steps} steps")
    for spec, ts in times.items():
        med = statistics.median(ts)
        print(f"  {spec:50s} median {med:9.3f}  min {min(ts):9.3f}  "
              f"({base / med:.2f}x of the first)")


if __name__ == "__main__":
    main()
