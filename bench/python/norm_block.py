"""Norm and softmax blocks, side by side: CPU eager, neuron eager, neuron adaptive in
exact and fast numerics (tier-2 row kernels where the block's ops have them), and
torch.compile (Inductor, CPU).

Blocks (float32, iterations queued 50 at a time between host reads):
- norm: LayerNorm -> x*1.5 + residual -> y*sigmoid(y) - 0.25*residual -> LayerNorm (issue
  22's block with its GELU left out);
- norm_gelu: the same with GELU (ATen computes float32 GELU with oneDNN, which tier 2
  cannot reproduce bit for bit: exact numerics leave that group on tier 1, fast numerics
  compile it);
- rms: RMSNorm as Llama writes it -> SiLU -> RMSNorm;
- softmax: scores * scale + column mask -> softmax (an attention row block).

Prints per block and size ms per iteration and the ratio of each config to CPU eager and
to Inductor; exact results are checked bit for bit against CPU eager, fast ones printed
as their largest difference.

    python bench/python/norm_block.py [--sizes 512x1024,4096x1024] [--blocks norm,rms]
                                      [--no-inductor] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import median_time, write_json  # noqa: E402


def block_fn(name, d, device):
    g = torch.Generator().manual_seed(0)
    w1, b1, w2, b2 = (torch.randn(d, generator=g).to(device) for _ in range(4))
    mask = (torch.randn(d, generator=g) * 0.1).to(device)

    def norm(x, act):
        h = F.layer_norm(x, (d,), w1, b1, 1e-5)
        y = act(h) * 1.5 + x
        z = y * torch.sigmoid(y) - 0.25 * x
        return F.layer_norm(z, (d,), w2, b2, 1e-5)

    def rms(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))

    if name == "norm":
        return lambda x: norm(x, lambda h: h)
    if name == "norm_gelu":
        return lambda x: norm(x, F.gelu)
    if name == "rms":
        return lambda x: rms(F.silu(rms(x, w1)), w2)
    if name == "softmax":
        return lambda x: torch.softmax(x * 0.125 + mask, -1)
    raise SystemExit(f"unknown block {name!r}: norm, norm_gelu, rms or softmax")


def measure(fn, x, sync, queued, repeats):
    def run():
        for _ in range(queued):
            fn(x)
    med, _, _ = median_time(run, sync, warmup=2, repeats=repeats)
    return med / queued * 1e3


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="512x1024,4096x1024")
    p.add_argument("--blocks", default="norm,norm_gelu,rms,softmax")
    p.add_argument("--queued", type=int, default=50)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--no-inductor", action="store_true")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    import neuron_eager
    results = []
    for size in a.sizes.split(","):
        rows, d = (int(v) for v in size.lower().split("x"))
        x_cpu = torch.randn(rows, d, generator=torch.Generator().manual_seed(1))
        for block in a.blocks.split(","):
            row = {"block": block, "size": size}
            cpu_fn = block_fn(block, d, "cpu")
            want = cpu_fn(x_cpu)
            row["cpu_eager"] = measure(cpu_fn, x_cpu, lambda: None, a.queued, a.repeats)
            if not a.no_inductor:
                comp = torch.compile(cpu_fn)
                comp(x_cpu)
                row["inductor"] = measure(comp, x_cpu, lambda: None, a.queued, a.repeats)
            x = x_cpu.to("neuron")
            fn = block_fn(block, d, "neuron")
            sync = lambda: x[:1, :1].cpu()  # noqa: E731
            for config in ("eager", "exact", "fast", "compiled"):
                # compiled: torch.compile(backend="neuron") in eager mode, exact numerics
                neuron_eager.set_mode("adaptive" if config in ("exact", "fast") else "eager")
                neuron_eager.set_policy({"base": "default", "numerics": "fast" if config == "fast" else "exact"})
                neuron_eager.reset_fusion_state()
                neuron_eager.reset_counters()
                run = fn
                if config == "compiled":
                    torch._dynamo.reset()
                    run = torch.compile(fn, backend="neuron")
                if config != "eager":  # hot, built, tried against tier 1
                    for _ in range(3):
                        for _ in range(a.queued):
                            run(x)
                        sync()
                        neuron_eager._C.native_wait_idle()
                row[config] = measure(run, x, sync, a.queued, a.repeats)
                got = run(x).cpu()
                row[config + "_bit_equal"] = bool(torch.equal(got, want))
                row[config + "_max_abs"] = float((got - want).abs().max())
                row[config + "_kernels"] = neuron_eager.counters().get("native_accepted", 0)
            neuron_eager.set_policy("default")
            neuron_eager.set_mode("eager")
            for k in ("eager", "exact", "fast", "compiled", "inductor"):
                if k in row:
                    row[k + "/cpu"] = row["cpu_eager"] / row[k]
                    if "inductor" in row:
                        row[k + "/inductor"] = row["inductor"] / row[k]
            results.append(row)
            ind = "inductor" in row
            print(f"{block:9s} {size:>10s}  ms: cpu {row['cpu_eager']:.3f}  neuron eager {row['eager']:.3f}"
                  f"  exact {row['exact']:.3f}  fast {row['fast']:.3f}  compiled {row['compiled']:.3f}"
                  + (f"  inductor {row['inductor']:.3f}" if ind else "")
                  + f"  | x CPU eager: exact {row['exact/cpu']:.2f} fast {row['fast/cpu']:.2f}"
                  + (f" | x Inductor: exact {row['exact/inductor']:.2f} fast {row['fast/inductor']:.2f}"
                     f" compiled {row['compiled/inductor']:.2f}" if ind else "")
                  + f" | compiled/exact {row['exact'] / row['compiled']:.2f}"
                  + f" | exact bit-equal {row['exact_bit_equal']}, compiled {row['compiled_bit_equal']},"
                  f" fast max |d| {row['fast_max_abs']:.1e}"
                  + f" | kernels {row['exact_kernels']}/{row['fast_kernels']}", flush=True)
    write_json(a.json, results)


if __name__ == "__main__":
    main()
