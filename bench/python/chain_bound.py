"""What bounds the fused LayerNorm + GELU + residual chains (the suite's chain_small,
chain_cache and chain_dram, 3 blocks): memory bandwidth or compute.

Tier 1 runs each block tile by tile (2 MiB of operands per tile: 131072 elements of
4 operands), calling ATen's layer_norm, gelu and add on every tile, so a tile's data stays
in cache between the three kernels. Its floor is therefore the time those three kernels
take on cache-resident data. This script measures, each config's shapes taking turns per
round:

- each chain shape (the suite's three and, full size, a sweep of 4096-column ones from
  cache-resident to DRAM-sized) on CPU eager (in a plain-PyTorch child process) and on
  `neuron` adaptive: ns per element per block and GB/s of compulsory traffic (read y,
  write y: 8 bytes per element per block). The two are timed minutes apart: for the
  adaptive / CPU eager ratios themselves, paired.py and the suite are the reference;
- the compute floor of each shape: layer_norm, gelu and add on one tile of it (the rows
  tier 1 puts in a tile, or all of them) on one thread, as tier 1 runs a tile, each
  alone and together, in ns per element; divided by the thread count (or the number of
  tiles, if fewer), the floor of tiles shared among the cores (measured in a child process, so this one keeps its thread
  count). CPU eager time / floor is the best adaptive / CPU eager ratio tier 1 can reach
  with these kernels on this machine;
- STREAM copy through torch over 256 MiB arrays: the bandwidth roofline.

If adaptive's ns per element at DRAM size is near the compute floor, the chain is
compute-bound: more bandwidth would not make it faster, and the roofline's 70% would need
kernels that compute faster than ATen's, not better memory traffic.

    python bench/python/chain_bound.py [--rounds 5] [--tiny] [--json out.json]
    python bench/python/chain_bound.py --floor 32x4096   # one floor alone (suite.py runs this)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

import torch
import torch.nn.functional as F

from bench_common import median_time, write_json

BLOCKS = 3
TILE_ELEMENTS = 131072  # tier 1's tile: 2 MiB of 4 float operands (fusion::tile_elements)


def chain_runner(rows, cols, device):
    torch.manual_seed(0)
    x = torch.randn(rows, cols).to(device)
    ln = torch.nn.LayerNorm(cols).to(device)

    def step():
        y = x
        for _ in range(BLOCKS):
            y = y + F.gelu(ln(y))
        return y

    return step


def tile_rows(rows, cols):
    return max(1, min(rows, TILE_ELEMENTS // cols))


def floor_runners(rows, cols):
    x = torch.randn(rows, cols)
    ln = torch.nn.LayerNorm(cols)
    g = torch.randn(rows, cols)
    return {"layer_norm": lambda: ln(x), "gelu": lambda: F.gelu(g), "add": lambda: x + g,
            "ln+gelu+add": lambda: x + F.gelu(ln(x))}


def floor_child(shape, repeats):
    """ns per element of each floor kernel on one thread (runs in a child process)."""
    rows, cols = shape
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    out = {}
    for name, fn in floor_runners(rows, cols).items():
        for _ in range(3):
            fn()
        out[name] = 1e9 * median_time(fn, lambda: None, 1, repeats)[0] / (rows * cols)
    print(json.dumps(out))


def parse_shape(text):
    try:
        rows, cols = (int(v) for v in text.lower().split("x"))
        if rows > 0 and cols > 0:
            return rows, cols
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"{text!r} is not a shape: expected ROWSxCOLS, e.g. 32x4096")


def measure_floor(shape):
    r = subprocess.run([sys.executable, __file__, "--floor", f"{shape[0]}x{shape[1]}"],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        sys.exit(f"floor child failed: {r.stderr[-1000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def shapes_for(tiny):
    if tiny:
        return {"small": (8, 32), "cache": (16, 64), "dram": (32, 128)}
    shapes = {"small": (64, 256), "cache": (512, 1024), "dram": (8192, 4096)}
    shapes.update({f"{r}x4096": (r, 4096) for r in (32, 128, 512, 2048)})
    return shapes


def rounds_of(runners, rounds, repeats):
    """Median seconds per runner, the runners taking turns (rotated order per round)."""
    for fn, sync in runners.values():  # warm-up: adaptive mode compiles hot segments
        for _ in range(6):
            fn()
            sync()
    times = {k: [] for k in runners}
    for r in range(rounds):
        keys = list(runners)
        keys = keys[r % len(keys):] + keys[:r % len(keys)]
        for k in keys:
            fn, sync = runners[k]
            times[k].append(median_time(fn, sync, 1, repeats)[0])
    return {k: statistics.median(v) for k, v in times.items()}


def cpu_child(tiny, rounds, repeats):
    """CPU eager's chains and STREAM copy, in plain PyTorch (runs in a child process: in a
    process with the neuron worker's OpenMP team, libgomp throttles CPU eager's team too)."""
    torch.set_grad_enabled(False)
    stream_bytes = (4 << 20) if tiny else (256 << 20)
    a, b = torch.empty(stream_bytes // 4), torch.ones(stream_bytes // 4)
    runners = {label: (chain_runner(r, c, "cpu"), lambda: None) for label, (r, c) in shapes_for(tiny).items()}
    runners["copy"] = (lambda: a.copy_(b), lambda: None)
    out = rounds_of(runners, rounds, repeats)
    out["copy_gbs"] = 2 * stream_bytes / out.pop("copy") / 1e9
    out["stream_mib"] = stream_bytes >> 20
    print(json.dumps(out))


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--tiny", action="store_true", help="small sizes (CI smoke run)")
    p.add_argument("--json", default=None)
    p.add_argument("--floor", type=parse_shape, default=None, metavar="ROWSxCOLS",
                   help="only print the compute floor (JSON, one thread) of one tile")
    p.add_argument("--cpu-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.floor:
        return floor_child(args.floor, 50)
    if args.cpu_child:
        return cpu_child(args.tiny, args.rounds, args.repeats)
    cmd = [sys.executable, __file__, "--cpu-child", "--rounds", str(args.rounds),
           "--repeats", str(args.repeats)] + (["--tiny"] if args.tiny else [])
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1200,
                       env=dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0"))
    if r.returncode != 0:
        sys.exit(f"CPU eager child failed: {r.stderr[-1000:]}")
    cpu = json.loads(r.stdout.strip().splitlines()[-1])
    copy_gbs, stream_mib = cpu.pop("copy_gbs"), cpu.pop("stream_mib")

    torch.set_grad_enabled(False)
    import neuron_eager  # only here: the children are plain PyTorch

    neuron_eager.set_mode("adaptive")
    shapes = shapes_for(args.tiny)
    runners = {label: (chain_runner(r, c, "neuron"), torch.neuron.synchronize)
               for label, (r, c) in shapes.items()}
    adaptive = rounds_of(runners, args.rounds, args.repeats)
    times = {("cpu", k): v for k, v in cpu.items()}
    times.update({("adaptive", k): v for k, v in adaptive.items()})
    tiles = {label: (tile_rows(r, c), c) for label, (r, c) in shapes.items()}
    floors = {t: measure_floor(t) for t in sorted(set(tiles.values()))}

    threads = torch.get_num_threads()
    res = {"threads": threads, "blocks": BLOCKS, "stream_copy_gbs": copy_gbs, "shapes": {}}
    print(f"threads {threads}; STREAM copy (torch, {stream_mib} MiB): {copy_gbs:.1f} GB/s")
    print(f"compute floor per tile, ns per element on 1 thread "
          f"(layer_norm / gelu / add / all three):")
    for (tr, tc), f in floors.items():
        print(f"  {tr}x{tc}: {f['layer_norm']:.3f} / {f['gelu']:.3f} / {f['add']:.3f} / "
              f"{f['ln+gelu+add']:.3f}")
    print(f"per shape, ns per element per block (GB/s of compulsory traffic); floor = all "
          f"three on one tile / min({threads} threads, tiles):")
    print(f"  {'shape':>10s} {'MiB':>6s} {'cpu':>15s} {'adaptive':>15s} {'floor':>15s} "
          f"{'adaptive/CPU':>12s} {'ceiling':>8s}")
    for label, (rows, cols) in shapes.items():
        elems = rows * cols * BLOCKS
        row = {"rows": rows, "cols": cols, "tile": list(tiles[label]),
               "floor_kernels_1thread": floors[tiles[label]]}
        for cfg in ("cpu", "adaptive"):
            ns = 1e9 * times[(cfg, label)] / elems
            row[cfg] = {"ns_per_element": ns, "gbs": 8 / ns}
        # Tiles are shared among the threads; a shape of one tile runs on one.
        sharing = min(threads, -(-rows // tiles[label][0]))
        floor_ns = floors[tiles[label]]["ln+gelu+add"] / sharing
        row["floor"] = {"ns_per_element": floor_ns, "gbs": 8 / floor_ns}
        row["adaptive_vs_cpu"] = row["cpu"]["ns_per_element"] / row["adaptive"]["ns_per_element"]
        row["ceiling_vs_cpu"] = row["cpu"]["ns_per_element"] / floor_ns
        res["shapes"][label] = row
        print(f"  {label:>10s} {rows * cols * 4 / 2**20:6.1f} "
              f"{row['cpu']['ns_per_element']:6.3f} ({row['cpu']['gbs']:5.1f}) "
              f"{row['adaptive']['ns_per_element']:6.3f} ({row['adaptive']['gbs']:5.1f}) "
              f"{floor_ns:6.3f} ({row['floor']['gbs']:5.1f}) "
              f"{row['adaptive_vs_cpu']:11.2f}x {row['ceiling_vs_cpu']:7.2f}x")
    dram = res["shapes"]["dram"]
    print(f"DRAM chain: adaptive {dram['adaptive']['gbs']:.1f} GB/s = "
          f"{dram['adaptive']['gbs'] / copy_gbs:.0%} of STREAM copy; its compute floor allows "
          f"{dram['floor']['gbs']:.1f} GB/s ({dram['floor']['gbs'] / copy_gbs:.0%})")
    write_json(args.json, res)


if __name__ == "__main__":
    main()
