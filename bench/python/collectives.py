"""Collective bandwidth of the "neuron" process group against Gloo on CPU tensors.

    python bench/python/collectives.py                      # 2 processes, 4 KB - 64 MB
    python bench/python/collectives.py --nproc 4 --rounds 15
    python bench/python/collectives.py --sizes 4K,1M --ops all_reduce

Launches itself under `torch.distributed.run --standalone`. One "cpu:gloo,neuron:neuron"
group carries both: per op and size, blocks of calls on CPU tensors (Gloo) and on neuron
tensors (the neuron backend, whose transport is that same Gloo on aliases of device
memory) take turns, the order alternating by round, so both see nearly the same machine.
A block ends when its results are on the host (the neuron block syncs the device). Bus
bandwidth as nccl-tests define it: all_reduce moves 2(n-1)/n of the buffer per rank,
all_gather (n-1)/n of the gathered buffer. Prints per op and size the median time per
call of each, their bus bandwidth and the ratio neuron/gloo (>= 1: as fast as Gloo on CPU
tensors). Figures only, nothing asserted.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
DEFAULT_SIZES = "4K,16K,64K,256K,1M,4M,16M,64M"


def parse_size(text):
    text = text.strip().upper()
    return int(text[:-1]) * UNITS[text[-1]] if text[-1] in UNITS else int(text)


def fmt_size(n):
    for unit in ("G", "M", "K"):
        if n >= UNITS[unit]:
            return f"{n // UNITS[unit]}{unit}B"
    return f"{n}B"


def worker(args):
    import torch
    import torch.distributed as dist

    dist.init_process_group("cpu:gloo,neuron:neuron")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.neuron.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.neuron.device_count())

    def make(op, nbytes, device):
        numel = max(1, nbytes // 4)
        x = torch.ones(numel, device=device)
        if op == "all_reduce":
            return lambda: dist.all_reduce(x)
        out = torch.empty(numel * world, device=device)
        return lambda: dist.all_gather_into_tensor(out, x)

    def block(fn, device, calls):
        dist.barrier()  # the ranks start each block together
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        if device == "neuron":
            torch.neuron.synchronize()
        return (time.perf_counter() - start) / calls

    results = []
    for op in args.ops.split(","):
        for nbytes in [parse_size(s) for s in args.sizes.split(",")]:
            calls = max(2, min(50, (8 << 20) // max(nbytes, 1)))
            fns = {d: make(op, nbytes, d) for d in ("cpu", "neuron")}
            for d in fns:  # warm-up (connections, pages)
                block(fns[d], d, 2)
            times = {"cpu": [], "neuron": []}
            for r in range(args.rounds):
                order = ("cpu", "neuron") if r % 2 == 0 else ("neuron", "cpu")
                for d in order:
                    times[d].append(block(fns[d], d, calls))
            med = {d: statistics.median(t) for d, t in times.items()}
            moved = nbytes * 2 * (world - 1) / world if op == "all_reduce" else nbytes * world * (world - 1) / world
            results.append({"op": op, "bytes": nbytes, "calls": calls, "gloo_s": med["cpu"], "neuron_s": med["neuron"],
                            "gloo_busbw": moved / med["cpu"], "neuron_busbw": moved / med["neuron"],
                            "ratio": med["cpu"] / med["neuron"]})
            del fns
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"world": world, "rounds": args.rounds, "results": results}, f)
    dist.destroy_process_group()


def report(path):
    with open(path) as f:
        data = json.load(f)
    print(f"{data['world']} processes, median of {data['rounds']} rounds; bus bandwidth in GB/s")
    print(f"{'op':<12} {'size':>6} {'gloo/call':>10} {'neuron/call':>12} {'gloo bw':>8} {'neuron bw':>10} {'neuron/gloo':>12}")
    for r in data["results"]:
        print(f"{r['op']:<12} {fmt_size(r['bytes']):>6} {r['gloo_s'] * 1e6:>8.0f}us {r['neuron_s'] * 1e6:>10.0f}us "
              f"{r['gloo_busbw'] / 1e9:>8.3f} {r['neuron_busbw'] / 1e9:>10.3f} {r['ratio']:>11.2f}x")
    ratios = [r["ratio"] for r in data["results"]]
    print(f"neuron/gloo bus bandwidth: min {min(ratios):.2f}x, median {statistics.median(ratios):.2f}x")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--sizes", default=DEFAULT_SIZES)
    p.add_argument("--ops", default="all_reduce,all_gather")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--out", default="collectives.json")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
           os.path.abspath(__file__), "--worker", "--sizes", args.sizes, "--ops", args.ops,
           "--rounds", str(args.rounds), "--out", os.path.abspath(args.out)]
    subprocess.run(cmd, check=True, env=dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1")))
    report(args.out)


if __name__ == "__main__":
    main()
