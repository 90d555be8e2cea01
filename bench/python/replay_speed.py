"""Replay speed: records (or reuses) a trace of about --ops ops, then times loading,
preparing and replaying it under each built-in policy.

    python bench/python/replay_speed.py [--ops 1000000] [--trace big.ntrace]
"""

import argparse
import os
import time


def record(path, ops):
    import torch
    import neuron_eager
    import neuron_eager.trace as nt
    neuron_eager.set_mode("adaptive")
    x = torch.randn(4, 8).to("neuron")
    w = torch.randn(4, 8).to("neuron")
    per_step = 16
    with nt.record(path) as rec:
        for step in range(ops // per_step):
            y = x
            for _ in range(per_step // 2):
                y = torch.tanh(y * w)
            if step % 64 == 63:
                torch.neuron.synchronize()
    print(rec.stats)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--ops", type=int, default=1_000_000)
    p.add_argument("--trace", default=os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results", "replay-speed.ntrace"),
        help="trace file (recorded if missing); default under bench/results/, which git ignores")
    args = p.parse_args()
    os.makedirs(os.path.dirname(os.path.abspath(args.trace)), exist_ok=True)
    if not os.path.exists(args.trace):
        t = time.perf_counter()
        record(args.trace, args.ops)
        print(f"recorded in {time.perf_counter() - t:.1f} s")
    from neuron_eager.trace import load
    from neuron_eager.trace import replay as rp
    t = time.perf_counter()
    trace = load(args.trace)
    load_s = time.perf_counter() - t
    prepared = rp.prepare(trace)
    print(f"{prepared.ops} ops, {len(trace.events)} events: load {load_s:.2f} s, "
          f"prepare {prepared.prepare_s:.2f} s")
    for policy in ("default", "aggressive", "conservative", "never"):
        for cost in ("measured", "trn2"):
            r = rp.replay(prepared, policy, cost)
            print(f"{policy:13s} {cost:9s} replay {r.replay_s:6.2f} s = "
                  f"{r.ops / r.replay_s / 1e6:5.2f} M ops/s; end to end (prepare + replay) "
                  f"{r.ops / (r.replay_s + prepared.prepare_s) / 1e6:5.2f} M ops/s; "
                  f"{r.compiles} compiles, {r.hit_rate:.1%} of ops fused")


if __name__ == "__main__":
    main()
