"""Steady-state time of `neuron` adaptive vs `neuron` eager vs CPU eager, ratios from one
run: LayerNorm + GELU + residual chains at three sizes, an AdamW step over ~100
parameters, an MLP training step; plus the DRAM-sized chain's achieved bandwidth against
this machine's measured copy bandwidth.

    python bench/python/adaptive.py [--repeats 7] [--tiny] [--json out.json]
"""

import argparse

import torch
import torch.nn as nn

import neuron_eager
from bench_common import median_time, write_json


def timeit(fn, device, warmup, repeats):
    return median_time(fn, torch.neuron.synchronize if device != "cpu" else lambda: None,
                       warmup, repeats)


def chain_workload(rows, cols):
    def make(device):
        torch.manual_seed(0)
        x = torch.randn(rows, cols).to(device)
        ln = nn.LayerNorm(cols).to(device)

        def step():
            y = x
            for _ in range(3):
                y = y + nn.functional.gelu(ln(y))
            return y
        return step
    return make


def adamw_workload(n_params=100, size=(128, 128)):
    def make(device):
        torch.manual_seed(0)
        params = [nn.Parameter(torch.randn(size).to(device)) for _ in range(n_params)]
        for p in params:
            p.grad = torch.randn(size).to(device)
        opt = torch.optim.AdamW(params, lr=1e-3)
        return opt.step
    return make


def mlp_workload(batch=64, width=256):
    def make(device):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, width),
                              nn.GELU(), nn.Linear(width, 10)).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x = torch.randn(batch, width).to(device)
        y = torch.randint(0, 10, (batch,)).to(device)

        def step():
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        return step
    return make


def copy_bandwidth_gbs(nbytes=256 << 20):
    src = torch.empty(nbytes // 4)
    src.fill_(1.0)
    dst = torch.empty_like(src)
    best = min(timeit(lambda: dst.copy_(src), "cpu", 2, 5))
    return 2 * nbytes / best / 1e9  # read + write


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--tiny", action="store_true", help="tiny sizes (CI smoke run)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if args.tiny:
        workloads = {"chain small": chain_workload(8, 32), "adamw": adamw_workload(4, (8, 8)),
                     "mlp step": mlp_workload(4, 16)}
        warmup, repeats = 4, 2
    else:
        workloads = {"chain small (64x256)": chain_workload(64, 256),
                     "chain cache (512x1024)": chain_workload(512, 1024),
                     "chain DRAM (8192x4096)": chain_workload(8192, 4096),
                     "adamw (100 x 128x128)": adamw_workload(),
                     "mlp step (64x256)": mlp_workload()}
        warmup, repeats = 6, args.repeats
    results = {}
    for name, make in workloads.items():
        row = {}
        row["cpu"] = timeit(make("cpu"), "cpu", warmup, repeats)
        neuron_eager.set_mode("eager")
        row["eager"] = timeit(make("neuron"), "neuron", warmup, repeats)
        neuron_eager.set_mode("adaptive")
        neuron_eager.reset_counters()
        row["adaptive"] = timeit(make("neuron"), "neuron", warmup, repeats)
        c = neuron_eager.counters()
        neuron_eager.set_mode("eager")
        row["fused_share"] = c["ops_in_fused_segments"] / max(1, c["ops_in_fused_segments"] + c["ops_per_op"])
        results[name] = row
    bandwidth = None if args.tiny else copy_bandwidth_gbs()
    print(f"{'workload':28s} {'cpu ms':>9s} {'eager ms':>9s} {'adapt ms':>9s} "
          f"{'adapt/cpu':>9s} {'adapt/eager':>11s} {'fused':>6s}")
    out = {}
    for name, row in results.items():
        cpu, eager, adaptive = (row[k][0] * 1e3 for k in ("cpu", "eager", "adaptive"))
        out[name] = {"cpu_ms": cpu, "eager_ms": eager, "adaptive_ms": adaptive,
                     "speedup_vs_cpu": cpu / adaptive, "speedup_vs_eager": eager / adaptive,
                     "fused_share": row["fused_share"]}
        print(f"{name:28s} {cpu:9.3f} {eager:9.3f} {adaptive:9.3f} {cpu / adaptive:8.2f}x "
              f"{eager / adaptive:10.2f}x {row['fused_share']:6.1%}")
    if bandwidth:
        name = "chain DRAM (8192x4096)"
        moved = 8192 * 4096 * 4 * 2 * 3  # each of 3 blocks reads y and writes y at least
        achieved = moved / (out[name]["adaptive_ms"] / 1e3) / 1e9
        out["bandwidth"] = {"machine_copy_gbs": bandwidth, "dram_chain_gbs": achieved,
                            "fraction": achieved / bandwidth}
        print(f"DRAM chain: {achieved:.1f} GB/s of the machine's {bandwidth:.1f} GB/s copy "
              f"bandwidth ({achieved / bandwidth:.0%})")
    write_json(args.json, out)


if __name__ == "__main__":
    main()
