"""A pointwise chain that tier 2 can fuse (every op has a native formula), run in adaptive
mode until its kernel is built and swapped in; prints the engine's counters and a digest
of the results as JSON. Used by test_native.py, in-process and as a subprocess (second
process, concurrent processes, broken compilers).

    python tests/python/native_workload.py [--dtype float32|float64] [--steps N] [--size N]
"""

import argparse
import json
import time

import torch

import neuron_eager


def chain(x, w, b):
    y = x * w + b                      # mul, add
    y = torch.sigmoid(y) * x           # sigmoid, mul
    y = y - 0.25 * b                   # mul.Tensor (wrapped scalar), sub
    y = torch.maximum(y, b).abs()      # maximum, abs
    y = torch.nn.functional.silu(y) / (w.abs() + 1.5)  # silu, abs, add, div
    y = torch.addcmul(y, x, w, value=0.5)
    y = torch.clamp_min(y, -0.75).neg().reciprocal()
    return y + x


def run(dtype=torch.float32, steps=40, size=1 << 20, wait=True, inject_at=-1):
    torch.manual_seed(0)
    x, w, b = (torch.randn(size, dtype=dtype) for _ in range(3))
    ref = chain(x, w, b)
    xd, wd, bd = x.to("neuron"), w.to("neuron"), b.to("neuron")
    neuron_eager.set_mode("adaptive")
    neuron_eager.set_policy({"tier": "native", "hot_threshold": 2, "guard": False})
    results_equal = True
    first_tier2 = None
    try:
        for step in range(steps):
            if step == inject_at:
                neuron_eager._C._inject_tile_group_failures(1)  # the next fused group throws
            out = chain(xd, wd, bd)
            torch.neuron.synchronize()
            results_equal &= bool(torch.equal(out.cpu(), ref))
            c = neuron_eager.counters()
            if first_tier2 is None and c["native_runs"] > 0:
                first_tier2 = step
            if wait and step % 5 == 4:
                neuron_eager._C.native_wait_idle()
    finally:
        neuron_eager.set_policy("default")
        neuron_eager.set_mode("eager")
    counters = {k: v for k, v in neuron_eager.counters().items()
                if k.startswith("native") or k in ("programs", "segments_fused", "fusion_failures")}
    return {"equal": results_equal, "first_tier2_step": first_tier2, "counters": counters}


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--size", type=int, default=1 << 20)
    ap.add_argument("--inject-at", type=int, default=-1,
                    help="step at which the next fused group throws (fault injection)")
    ap.add_argument("--start-at", type=float, default=0.0,
                    help="wall-clock time to start at (two processes start together)")
    args = ap.parse_args()
    while time.time() < args.start_at:
        time.sleep(0.001)
    print(json.dumps(run(getattr(torch, args.dtype), args.steps, args.size, inject_at=args.inject_at)))
