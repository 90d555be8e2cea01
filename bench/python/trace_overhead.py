"""Recording overhead on an MLP training loop: `neuron` eager with and without tracing,
as a ratio from one run, and the bytes per op of the trace file.

    python bench/python/trace_overhead.py [--steps 200] [--repeats 5]
"""

import argparse
import os
import statistics
import tempfile
import time

import torch
import torch.nn as nn

import neuron_eager
from neuron_eager import _C

from bench_common import write_json


def make():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 128), nn.GELU(),
                          nn.Linear(128, 10)).to("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(32, 64).to("neuron")
    y = torch.randint(0, 10, (32,)).to("neuron")
    return model, opt, x, y


def loop(model, opt, x, y, steps):
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    torch.neuron.synchronize()


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    model, opt, x, y = make()
    loop(model, opt, x, y, 20)  # warm-up
    plain, traced, per_op_bytes = [], [], []
    with tempfile.TemporaryDirectory() as d:
        for r in range(args.repeats):
            t = time.perf_counter()
            loop(model, opt, x, y, args.steps)
            plain.append(time.perf_counter() - t)
            path = os.path.join(d, f"run{r}.ntrace")
            neuron_eager.reset_counters()
            _C.trace_start(path, "")
            t = time.perf_counter()
            loop(model, opt, x, y, args.steps)
            traced.append(time.perf_counter() - t)
            events, size = _C.trace_stop()
            ops = neuron_eager.counters()["ops_dispatched"]
            per_op_bytes.append(size / max(ops, 1))
    res = {"steps": args.steps, "plain_s": statistics.median(plain),
           "traced_s": statistics.median(traced), "bytes_per_op": statistics.median(per_op_bytes)}
    res["overhead_ratio"] = res["traced_s"] / res["plain_s"]
    print(f"MLP training loop, {args.steps} steps x {args.repeats} repeats (medians):")
    print(f"  neuron eager            : {res['plain_s'] * 1e3:.1f} ms")
    print(f"  neuron eager + tracing  : {res['traced_s'] * 1e3:.1f} ms  "
          f"(ratio {res['overhead_ratio']:.3f}, overhead {100 * (res['overhead_ratio'] - 1):.1f}%)")
    print(f"  trace size              : {res['bytes_per_op']:.1f} bytes per op")
    write_json(args.json, res)


if __name__ == "__main__":
    main()
