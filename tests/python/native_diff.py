"""Random pointwise programs over the ops tier 2 has formulas for, run in loops in adaptive
mode with tier 2 forced on (every group gets a kernel after one run), compared bit for bit
with CPU eager. Prints a JSON summary. Used by test_native.py (in a subprocess with its own
NEURON_CACHE_DIR).

    python tests/python/native_diff.py [--programs N] [--seed S]
"""

import argparse
import json
import random

import torch

import neuron_eager

UNARY = ["neg", "abs", "sigmoid", "silu", "reciprocal", "rsqrt", "expm1", "log1p", "relu_bwd",
         "clamp_min", "clamp_max", "scale", "gelu64", "exp", "log", "tanh", "erf"]
BINARY = ["add", "sub", "mul", "div", "maximum", "minimum", "add_alpha", "rsub", "sigmoid_bwd",
          "tanh_bwd", "silu_bwd"]
TERNARY = ["addcmul", "addcdiv"]


def apply(name, a, b=None, c=None):
    if name == "neg": return -a
    if name == "abs": return a.abs()
    if name == "sigmoid": return a.sigmoid()
    if name == "silu": return torch.nn.functional.silu(a)
    if name == "reciprocal": return (a.abs() + 0.5).reciprocal()
    if name == "rsqrt": return (a.abs() + 0.25).rsqrt()
    if name == "expm1": return a.clamp(-3, 3).expm1()
    if name == "log1p": return a.abs().log1p()
    if name == "exp": return a.clamp(-10, 10).exp()
    if name == "log": return (a.abs() + 0.1).log()
    if name == "tanh": return a.tanh()
    if name == "erf": return a.erf()
    if name == "relu_bwd": return torch.ops.aten.threshold_backward(a, a * 0.5, 0.0)
    if name == "clamp_min": return torch.clamp_min(a, -0.5)
    if name == "clamp_max": return torch.clamp_max(a, 0.75)
    if name == "scale": return a * 1.25
    if name == "gelu64": return torch.nn.functional.gelu(a) if a.dtype == torch.float64 else a * 0.5
    if name == "add": return a + b
    if name == "sub": return a - b
    if name == "mul": return a * b
    if name == "div": return a / (b.abs() + 0.5)
    if name == "maximum": return torch.maximum(a, b)
    if name == "minimum": return torch.minimum(a, b)
    if name == "add_alpha": return torch.add(a, b, alpha=0.3)
    if name == "rsub": return torch.rsub(a, b, alpha=2.0)
    if name == "sigmoid_bwd": return torch.ops.aten.sigmoid_backward(a, b.sigmoid())
    if name == "tanh_bwd": return torch.ops.aten.tanh_backward(a, b.tanh())
    if name == "silu_bwd": return torch.ops.aten.silu_backward(a, b)
    if name == "addcmul": return torch.addcmul(a, b, c, value=0.5)
    if name == "addcdiv": return torch.addcdiv(a, b, c.abs() + 0.5, value=-0.75)
    raise AssertionError(name)


def make(rng):
    shape = rng.choice([(4099,), (64, 257), (3, 50, 33), (1 << 16,)])
    dtype = rng.choice([torch.float32, torch.float64])
    steps = []
    n = 3
    for _ in range(rng.randint(3, 9)):
        kind = rng.random()
        if kind < 0.4:
            steps.append((rng.choice(UNARY), [rng.randrange(n)]))
        elif kind < 0.85:
            steps.append((rng.choice(BINARY), [rng.randrange(n), rng.randrange(n)]))
        else:
            steps.append((rng.choice(TERNARY), [rng.randrange(n) for _ in range(3)]))
        n += 1
    return shape, dtype, steps


def run(program, inputs):
    values = list(inputs)
    for name, args in program[2]:
        values.append(apply(name, *[values[i] for i in args]))
    return values[-1]


TIERS = ("native", "instant", "eager")


def compare_rounds(progs, data, run, tier="native"):
    """Runs every program on the device in rounds (data[i]: CPU inputs, CPU eager's result,
    device inputs) and returns the indices of programs whose result ever differed from CPU
    eager's, and the engine's counters. tier "native": adaptive mode with tier 2 forced on
    (every group gets a kernel after one run), the guard off; "instant": adaptive mode with
    tier-1 programs only (no compiler: cheap, for fuzzing at scale); "eager": per-op eager."""
    if tier not in TIERS:
        raise ValueError(f"tier {tier!r}: allowed {', '.join(TIERS)}")
    if tier == "eager":
        neuron_eager.set_mode("eager")
    else:
        neuron_eager.set_mode("adaptive")
        neuron_eager.set_policy({"tier": tier, "hot_threshold": 2, "native_min_runs": 1,
                                 "min_group_elements": 0,  # odd small sizes group too
                                 "guard": False,  # every fused program runs: none is demoted
                                 # Rounds over hundreds of programs look like nothing to fuse
                                 # at first (every key new): keep recording.
                                 "settle_cuts": 0})
    mismatches = []
    # Rounds over all programs: every program gets hot, its kernels build in the
    # background, and later rounds run them (after the bit-for-bit trial against tier 1).
    # Tier 1 is fused from the third occurrence; eager needs no repeat beyond the second.
    rounds = {"native": 12, "instant": 5, "eager": 2}[tier]
    for round_ in range(rounds):
        for i, prog in enumerate(progs):
            out = run(prog, data[i][2]).cpu()
            if not torch.equal(out, data[i][1]) and i not in mismatches:
                mismatches.append(i)
        if round_ == 3 and tier == "native":
            neuron_eager._C.native_wait_idle()
    neuron_eager.set_policy("default")
    neuron_eager.set_mode("eager")
    wanted = ("native", "segments_fused", "ops_") if tier != "eager" else ("ops_",)
    return mismatches, {k: v for k, v in neuron_eager.counters().items()
                        if isinstance(v, (int, float)) and k.startswith(wanted)}


def differential(programs, seed, make, inputs, run, only=None, tier="native"):
    """`programs` programs from make(rng), each on inputs(program, generator), compared
    with CPU eager (compare_rounds, in `tier`); the JSON summary. only: run just that
    program index (the same program and inputs as in the full run: a mismatch's replay)."""
    rng = random.Random(seed)
    progs = [make(rng) for _ in range(programs)]
    index = [i for i in range(programs) if only is None or i == only]
    data = []
    for i in index:
        cpu = inputs(progs[i], torch.Generator().manual_seed(seed * 1000 + i))
        data.append((cpu, run(progs[i], cpu), [t.to("neuron") for t in cpu]))
    mismatches, c = compare_rounds([progs[i] for i in index], data, run, tier)
    return {"programs": len(index), "mismatches": [index[m] for m in mismatches],
            "counters": c, "shown": {str(index[m]): describe(progs[index[m]]) for m in mismatches}}


def describe(program):
    """A program as text (shape, dtype, steps; arguments are value indices: the inputs
    first, then each step's result), for a mismatch report."""
    shape, dtype, steps = program
    return f"{tuple(shape)} {str(dtype).replace('torch.', '')}: " + "; ".join(
        f"{s[0]}({', '.join(map(str, s[1] if isinstance(s[1], list) else s[1:]))})" for s in steps)


def main(programs, seed, only=None, tier="native"):
    return differential(programs, seed, make, lambda prog, g: [torch.randn(prog[0], dtype=prog[1], generator=g)
                                                               for _ in range(3)], run, only, tier)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--programs", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", type=int, default=None, help="replay one program index")
    ap.add_argument("--tier", choices=TIERS, default="native",
                    help="native: tier 2 forced on; instant: tier-1 programs; eager: per op")
    a = ap.parse_args()
    print(json.dumps(main(a.programs, a.seed, a.only, a.tier)))
