"""What bounds the DRAM-sized fused chain (suite's chain_dram: LayerNorm + GELU + residual,
3 blocks, 4096 columns): memory bandwidth or compute.

Tier 1 runs each block tile by tile (2 MiB of operands per tile), calling ATen's
layer_norm, gelu and add on every tile, so a tile's data stays in cache between the three
kernels. Its floor is therefore the time those three kernels take on cache-resident data.
This script measures, in one process, with configs taking turns per round:

- the chain at several row counts, cache-resident to DRAM-sized, on CPU eager and on
  `neuron` adaptive: ns per element per block and GB/s of compulsory traffic (read y,
  write y: 8 bytes per element per block);
- the compute floor: layer_norm, gelu and add on one cache-resident tile (32 rows, the
  tile tier 1 cuts at 4096 columns) on one thread, as tier 1 runs a tile, each alone and
  together, in ns per element; divided by the thread count, the floor of tiles shared
  among the cores (measured in a child process, so this one keeps its thread count);
- STREAM copy through torch over 256 MiB arrays: the bandwidth roofline.

If adaptive's ns per element at DRAM size is near the compute floor, the chain is
compute-bound: more bandwidth would not make it faster, and the roofline's 70% would need
kernels that compute faster than ATen's, not better memory traffic.

    python bench/python/chain_bound.py [--rounds 5] [--tiny] [--json out.json]
    python bench/python/chain_bound.py --floor 32     # the floor alone (suite.py runs this)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

COLS = 4096
BLOCKS = 3


def timed(fn, sync, repeats):
    fn()
    sync()
    best = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        sync()
        best.append(time.perf_counter() - t)
    return statistics.median(best)


def chain_runner(rows, device):
    torch.manual_seed(0)
    x = torch.randn(rows, COLS).to(device)
    ln = torch.nn.LayerNorm(COLS).to(device)

    def step():
        y = x
        for _ in range(BLOCKS):
            y = y + F.gelu(ln(y))
        return y

    return step


def floor_runners(tile_rows):
    x = torch.randn(tile_rows, COLS)
    ln = torch.nn.LayerNorm(COLS)
    g = torch.randn(tile_rows, COLS)
    return {"layer_norm": lambda: ln(x), "gelu": lambda: F.gelu(g), "add": lambda: x + g,
            "ln+gelu+add": lambda: x + F.gelu(ln(x))}


def floor_child(tile_rows, repeats):
    """ns per element of each floor kernel on one thread (runs in a child process)."""
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    out = {}
    for name, fn in floor_runners(tile_rows).items():
        for _ in range(3):
            fn()
        out[name] = 1e9 * timed(fn, lambda: None, repeats) / (tile_rows * COLS)
    print(json.dumps(out))


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--tiny", action="store_true", help="small sizes (CI smoke run)")
    p.add_argument("--json", default=None)
    p.add_argument("--floor", type=int, default=0, metavar="ROWS",
                   help="only print the compute floor (JSON, one thread) of a ROWS-row tile")
    args = p.parse_args()
    if args.floor:
        return floor_child(args.floor, 50)
    torch.set_grad_enabled(False)
    import neuron_eager  # after --floor: the floor is plain PyTorch

    row_counts = [8, 32] if args.tiny else [32, 128, 512, 2048, 8192]
    tile_rows = 8 if args.tiny else 32  # 512 KiB per operand: three operands stay in L2
    stream_bytes = (4 << 20) if args.tiny else (256 << 20)

    def cpu_sync():
        pass

    def neuron_sync():
        torch.neuron.synchronize()

    neuron_eager.set_mode("adaptive")
    runners = {}
    for rows in row_counts:
        runners[("cpu", rows)] = (chain_runner(rows, "cpu"), cpu_sync)
        runners[("adaptive", rows)] = (chain_runner(rows, "neuron"), neuron_sync)
    for fn, sync in runners.values():  # warm-up: adaptive mode compiles hot segments
        for _ in range(6):
            fn()
        sync()

    a, b = torch.empty(stream_bytes // 4), torch.ones(stream_bytes // 4)
    times = {k: [] for k in runners}
    copy = []
    for r in range(args.rounds):
        keys = list(runners)
        keys = keys[r % len(keys):] + keys[:r % len(keys)]  # rotated order per round
        for k in keys:
            fn, sync = runners[k]
            times[k].append(timed(fn, sync, args.repeats))
        copy.append(timed(lambda: a.copy_(b), cpu_sync, args.repeats))
    copy_gbs = 2 * stream_bytes / statistics.median(copy) / 1e9
    r = subprocess.run([sys.executable, __file__, "--floor", str(tile_rows)],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        sys.exit(f"floor child failed: {r.stderr[-1000:]}")
    floor = json.loads(r.stdout.strip().splitlines()[-1])

    res = {"threads": torch.get_num_threads(), "cols": COLS, "blocks": BLOCKS,
           "tile_rows": tile_rows, "stream_copy_gbs": copy_gbs, "chain": {}, "floor": {}}
    print(f"threads {res['threads']}; STREAM copy (torch, {stream_bytes >> 20} MiB): "
          f"{copy_gbs:.1f} GB/s")
    threads = res["threads"]
    print(f"compute floor on a cache-resident {tile_rows}x{COLS} tile, ns per element "
          f"(1 thread; / {threads} threads):")
    for name, ns in floor.items():
        res["floor"][name] = ns
        print(f"  {name:12s} {ns:6.3f}  {ns / threads:6.3f}")
    floor_ns = floor["ln+gelu+add"] / threads
    floor_gbs = 8 / floor_ns
    res["floor_ns"], res["floor_gbs"] = floor_ns, floor_gbs
    print(f"  a block bound by this compute on {threads} threads moves at most {floor_gbs:.1f} GB/s "
          f"({100 * floor_gbs / copy_gbs:.0f}% of STREAM copy)")
    print(f"chain, ns per element per block (GB/s of compulsory traffic):")
    print(f"  {'rows':>6s} {'MiB':>6s} {'cpu':>16s} {'adaptive':>16s} {'adaptive/floor':>15s}")
    for rows in row_counts:
        elems = rows * COLS * BLOCKS
        row = {}
        for cfg in ("cpu", "adaptive"):
            ns = 1e9 * statistics.median(times[(cfg, rows)]) / elems
            row[cfg] = {"ns_per_element": ns, "gbs": 8 / ns}
        res["chain"][rows] = row
        print(f"  {rows:6d} {rows * COLS * 4 / 2**20:6.1f} "
              f"{row['cpu']['ns_per_element']:7.3f} ({row['cpu']['gbs']:5.1f})  "
              f"{row['adaptive']['ns_per_element']:7.3f} ({row['adaptive']['gbs']:5.1f})  "
              f"{row['adaptive']['ns_per_element'] / floor_ns:14.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
