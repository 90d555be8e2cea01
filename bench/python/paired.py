"""Paired comparison of configs on one suite workload, robust to a drifting machine.

On a shared VM the same CPU eager step can take 2 ms one minute and 4 ms the next, so
configs timed in turn minutes apart compare the machine, not the configs. Here every
config lives in its own process for the whole run, and the processes take turns running
short blocks of steps (one runs, the others sleep): block k of every config sees nearly
the same machine. Per round, each config's block time is divided by the first config's
block time in that round; the median of those ratios over rounds is the figure. Every
step ends with a sync, as in the suite (--no-step-sync: one sync per block).

    python bench/python/paired.py mlp_train cpu adaptive adaptive:NEURON_PIN_WORKERS=0
    python bench/python/paired.py chain_small cpu eager adaptive --rounds 30 --block-s 0.2

A config is cpu, eager, adaptive or compile, optionally followed by :VAR=value[,VAR=value]
environment settings for its process. Prints per config: the median block time (ms per
step), the median ratio to the first config, and the ratio's spread (25th-75th percentile).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def child(workload, config, tiny, block_s, step_sync):
    sys.path.insert(0, HERE)
    import torch  # noqa: F401
    from suite_worker import config_setup, settle_adaptive, timed
    from suite_workloads import all_workloads

    wl = {w.name: w for w in all_workloads(tiny)}[workload]
    device, compiled, sync = config_setup(config, "inductor")
    run = wl.make(device, compiled)
    warm = [timed(run.step, sync) for _ in range(5)]
    if config == "adaptive":
        settle_adaptive(run, sync, warm)
    per_step = statistics.median(warm[-3:])
    steps = max(1, int(block_s / max(per_step, 1e-6)))
    print(json.dumps({"ready": True, "steps": steps}), flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        t = time.perf_counter()
        for _ in range(steps):
            run.step()
            if step_sync:  # as the suite times steps (and a loop reading its loss runs)
                sync()
        sync()
        print(json.dumps({"ms": (time.perf_counter() - t) / steps * 1e3}), flush=True)


def parse_spec(spec):
    config, _, env = spec.partition(":")
    if config not in ("cpu", "eager", "adaptive", "compile"):
        raise SystemExit(f"paired.py: unknown config {config!r} in {spec!r} "
                         "(allowed: cpu, eager, adaptive, compile, then :VAR=value,...)")
    extra = {}
    for kv in filter(None, env.split(",")):
        k, sep, v = kv.partition("=")
        if not sep or not k:
            raise SystemExit(f"paired.py: {kv!r} in {spec!r} is not VAR=value")
        extra[k] = v
    return config, extra


def percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(round(q * (len(xs) - 1)))))]


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workload")
    p.add_argument("configs", nargs="+")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--block-s", type=float, default=0.25, help="seconds per block (about)")
    p.add_argument("--gap-s", type=float, default=0.05, help="idle seconds between blocks")
    p.add_argument("--raw", action="store_true", help="print every block's time")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--no-step-sync", action="store_true",
                   help="sync once per block, not after every step (the host may run ahead)")
    p.add_argument("--json", default=None, help="also write the figures here")
    if sys.argv[1:2] == ["--child"]:  # --child WORKLOAD CONFIG BLOCK_S TINY STEP_SYNC
        _, _, workload, config, block_s, tiny, step_sync = sys.argv
        return child(workload, config, tiny == "1", float(block_s), step_sync == "1")
    args = p.parse_args()

    specs = [(s, *parse_spec(s)) for s in args.configs]
    procs = []
    for spec, config, extra in specs:
        env = dict(os.environ, **extra)
        cmd = [sys.executable, os.path.abspath(__file__), "--child", args.workload, config,
               str(args.block_s), "1" if args.tiny else "0", "0" if args.no_step_sync else "1"]
        procs.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      text=True, env=env))
        ready = json.loads(procs[-1].stdout.readline() or "{}")  # one warms up at a time
        if not ready.get("ready"):
            for pr in procs:
                pr.kill()
            raise SystemExit(f"paired.py: {spec} failed to start (its error is above)")
    times = {s[0]: [] for s in specs}
    try:
        for r in range(args.rounds):
            order = list(range(len(specs)))
            if r % 2:
                order.reverse()  # neither config always runs right after the other
            for i in order:
                # Spinning threads of the last block (libgomp's team spins for milliseconds
                # after a parallel region) settle before the next block starts.
                time.sleep(args.gap_s)
                procs[i].stdin.write("run\n")
                procs[i].stdin.flush()
                times[specs[i][0]].append(json.loads(procs[i].stdout.readline())["ms"])
    finally:
        for pr in procs:
            try:
                pr.stdin.close()
            except OSError:
                pass
            pr.wait()
    base = times[specs[0][0]]
    out = {}
    print(f"{args.workload}: {args.rounds} rounds, ratio = first config's time / this config's "
          f"(> 1: faster than {specs[0][0]})")
    for spec, _, _ in specs:
        ratios = [b / t for b, t in zip(base, times[spec])]
        out[spec] = {"median_ms": statistics.median(times[spec]),
                     "speedup": statistics.median(ratios),
                     "speedup_p25": percentile(ratios, 0.25),
                     "speedup_p75": percentile(ratios, 0.75)}
        o = out[spec]
        print(f"  {spec:40s} {o['median_ms']:8.3f} ms/step  x{o['speedup']:.2f} "
              f"({o['speedup_p25']:.2f}-{o['speedup_p75']:.2f})")
    if args.raw:
        for spec, _, _ in specs:
            print(f"  raw {spec}: " + " ".join(f"{t:.2f}" for t in times[spec]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"workload": args.workload, "rounds": args.rounds, "configs": out}, f,
                      indent=1)


if __name__ == "__main__":
    main()
