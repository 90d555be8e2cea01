"""Random row programs (layer norm, softmax and log_softmax over the last dim, with
pointwise ops around them whose operands may be one row broadcast down the rows or one
value per row), run in loops in adaptive mode with tier 2 forced on, compared bit for bit
with CPU eager. Prints a JSON summary. Used by test_native.py (in a subprocess with its own
NEURON_CACHE_DIR).

    python tests/python/row_diff.py [--programs N] [--seed S]
"""

import argparse
import json
import random

import torch
import torch.nn.functional as F

from native_diff import TIERS, differential

ROW = ["layer_norm", "layer_norm_plain", "softmax", "log_softmax", "rms_norm", "center", "sum_scale"]
POINTWISE = ["add", "mul", "sub", "sigmoid", "silu", "scale", "add_col", "mul_col", "mul_row", "rsqrt"]


def apply(name, x, y, col, rowv):
    d = x.shape[-1]
    if name == "layer_norm": return F.layer_norm(x, (d,), col, col * 0.5 + 1.0, 1e-5)
    if name == "layer_norm_plain": return F.layer_norm(x, (d,), None, None, 1e-6)
    if name == "softmax": return torch.softmax(x, -1)
    if name == "log_softmax": return torch.log_softmax(x, -1)
    # RMSNorm as Llama writes it: mean of squares, rsqrt(+eps) per row, times a weight.
    if name == "rms_norm": return col * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    if name == "center": return x - x.mean(-1, keepdim=True)
    if name == "sum_scale": return x * (x.sum(-1, keepdim=True).abs() + 1.0).reciprocal()
    if name == "add": return x + y
    if name == "mul": return x * y
    if name == "sub": return x - y
    if name == "sigmoid": return x.sigmoid()
    if name == "silu": return F.silu(x)
    if name == "scale": return x * 1.5
    if name == "add_col": return x + col
    if name == "mul_col": return x * col
    if name == "mul_row": return x * rowv
    if name == "rsqrt": return (x.abs() + 0.25).rsqrt()
    raise AssertionError(name)


def make(rng):
    # 1000 rows: tall enough that a tier-1 row group cuts them into several tiles (per-row
    # values must keep ATen's vector tails, see test_adaptive).
    shape = (rng.choice([8, 33, 200, 1000]), rng.choice([64, 256, 320, 1024]))
    dtype = rng.choice([torch.float32, torch.float64])
    steps = []
    n = 2
    for _ in range(rng.randint(4, 9)):
        name = rng.choice(ROW) if rng.random() < 0.35 else rng.choice(POINTWISE)
        steps.append((name, rng.randrange(n), rng.randrange(n)))
        n += 1
    return shape, dtype, steps


def run(program, inputs):
    a, b, col, rowv = inputs
    values = [a, b]
    for name, i, j in program[2]:
        values.append(apply(name, values[i], values[j], col, rowv))
    return values[-1]


def inputs(prog, g):
    (r, d), dtype = prog[0], prog[1]
    return [torch.randn(r, d, dtype=dtype, generator=g), torch.randn(r, d, dtype=dtype, generator=g),
            torch.randn(d, dtype=dtype, generator=g), torch.randn(r, 1, dtype=dtype, generator=g)]


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--programs", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", type=int, default=None, help="replay one program index")
    ap.add_argument("--tier", choices=TIERS, default="native",
                    help="native: tier 2 forced on; instant: tier-1 programs; eager: per op")
    a = ap.parse_args()
    print(json.dumps(differential(a.programs, a.seed, make, inputs, run, a.only, a.tier)))
