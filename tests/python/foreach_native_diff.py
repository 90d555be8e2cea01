"""Foreach groups on tier 2: each case applies a few in-place foreach ops (the optimizer
kinds) to lists of tensors, run in adaptive mode with tier 2 forced on, and is compared bit
for bit with the same ops on CPU after every run. Prints per case the tier-2 counters it
moved, as JSON. Used by test_native.py (in a subprocess with its own NEURON_CACHE_DIR).

    python tests/python/foreach_native_diff.py [--only CASE] [--rounds N]
"""

import argparse
import json

import torch

import neuron_eager

F = torch


def adam_like(p, g, m, v, k):
    torch._foreach_mul_(p, 0.999)
    torch._foreach_lerp_(m, g, 0.1)
    torch._foreach_mul_(v, 0.999)
    torch._foreach_addcmul_(v, g, g, 0.001)
    s = torch._foreach_sqrt(v)
    torch._foreach_div_(s, [1.0 - 0.999 ** (k + j + 1) for j in range(len(p))])
    torch._foreach_add_(s, 1e-8)
    torch._foreach_addcdiv_(p, m, s, [-1e-3 / (1.0 - 0.9 ** (k + j + 1)) for j in range(len(p))])


CASES = {
    "mul_scalar": lambda p, g, m, v, k: (torch._foreach_mul_(p, 0.75), torch._foreach_mul_(m, -1.5)),
    "mul_list": lambda p, g, m, v, k: (torch._foreach_mul_(p, g), torch._foreach_mul_(m, p)),
    "div": lambda p, g, m, v, k: (torch._foreach_div_(p, 3.0), torch._foreach_div_(m, [1.5 + j for j in range(len(p))])),
    "add_sub": lambda p, g, m, v, k: (torch._foreach_add_(p, 0.25), torch._foreach_sub_(m, g, alpha=0.5),
                                      torch._foreach_add_(v, g, alpha=2.0), torch._foreach_sub_(p, [0.1] * len(p))),
    "lerp": lambda p, g, m, v, k: (torch._foreach_lerp_(m, g, 0.1), torch._foreach_lerp_(p, g, 0.9)),
    "addcmul_addcdiv": lambda p, g, m, v, k: (torch._foreach_addcmul_(p, g, m, 0.5),
                                              torch._foreach_addcdiv_(m, g, torch._foreach_add(v, 1.0), -0.25)),
    "sqrt_neg_abs": lambda p, g, m, v, k: (torch._foreach_abs_(p), torch._foreach_sqrt_(p), torch._foreach_neg_(m)),
    "maximum": lambda p, g, m, v, k: (torch._foreach_maximum_(v, g), torch._foreach_mul_(v, 0.5)),
    # Every element a column-major copy: not a kernel's contiguous operand, so no kernel.
    "noncontiguous": lambda p, g, m, v, k: (torch._foreach_mul_(p, [x.t().contiguous().t() for x in g]),
                                            torch._foreach_add_(p, 1.0)),
    "adam": adam_like,
}


def make(shapes, dtype, seed):
    """Four lists (p, g, m, v); v is positive (a second moment: its square root is real)."""
    gen = torch.Generator().manual_seed(seed)
    lists = [[torch.randn(s, dtype=dtype, generator=gen) for s in shapes] for _ in range(4)]
    lists[3] = [t.abs() for t in lists[3]]
    return lists


def run_case(name, rounds):
    fn = CASES[name]
    # Sizes with and without vector tails, one large enough to be cut into pieces.
    shapes = [(64, 33), (1000,), (7,), (300, 300), (4096,)]
    out = {}
    for dtype in (torch.float32, torch.float64):
        cpu = make(shapes, dtype, 1)
        dev = [[t.to("neuron") for t in lst] for lst in cpu]
        before = neuron_eager.counters()
        equal = True
        for k in range(rounds):
            fn(*cpu, k)
            fn(*dev, k)
            if k == 3:
                torch.neuron.synchronize()
                neuron_eager._C.native_wait_idle()
            for a, b in zip(cpu, dev):
                equal &= all(torch.equal(x, y.cpu()) for x, y in zip(a, b))
        after = neuron_eager.counters()
        out[str(dtype).split(".")[-1]] = {
            "equal": equal,
            **{k[len("native_"):]: after[k] - before[k] for k in after if k.startswith("native_")}}
    return out


def run_adamw(rounds):
    """torch.optim.AdamW (its foreach path on neuron) against CPU's, parameters of mixed
    sizes and one non-contiguous gradient list element (that element runs on tier 1)."""
    gen = torch.Generator().manual_seed(2)
    shapes = [(33, 17), (1000,), (5,), (256, 64), (64,)]
    init = [torch.randn(s, generator=gen) for s in shapes]
    grads = [[torch.randn(s, generator=gen) for s in shapes] for _ in range(rounds)]
    for g in grads:
        g[3] = g[3].t().contiguous().t()  # column-major: element 3 runs on tier 1

    def make(device):
        ps = [t.clone().to(device).requires_grad_() for t in init]
        return ps, torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1)

    cpu, cpu_opt = make("cpu")
    dev, dev_opt = make("neuron")
    before = neuron_eager.counters()
    equal = True
    for k in range(rounds):
        for ps, opt, device in ((cpu, cpu_opt, "cpu"), (dev, dev_opt, "neuron")):
            for p, g in zip(ps, grads[k]):
                p.grad = g.to(device)
            opt.step()
        if k == 3:
            torch.neuron.synchronize()
            neuron_eager._C.native_wait_idle()
        equal &= all(torch.equal(a.detach(), b.detach().cpu()) for a, b in zip(cpu, dev))
    after = neuron_eager.counters()
    return {"float32": {"equal": equal, **{k[len("native_"):]: after[k] - before[k]
                                           for k in after if k.startswith("native_")}}}


def main(only, rounds):
    neuron_eager.set_mode("adaptive")
    # The guard off: a key it demoted on tier 1's first timings would run per op from then
    # on, and whether a group ever asked for its kernel (or found its operands unfit for
    # one) would hang on those timings (CI once saw the non-contiguous case never ask).
    neuron_eager.set_policy({"tier": "native", "hot_threshold": 2, "native_min_runs": 1, "guard": False})
    try:
        out = {name: run_case(name, rounds) for name in CASES if not only or name == only}
        if not only or only == "torch_adamw":
            out["torch_adamw"] = run_adamw(rounds)
        return out
    finally:
        neuron_eager.set_policy("default")
        neuron_eager.set_mode("eager")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    ap.add_argument("--rounds", type=int, default=14)
    a = ap.parse_args()
    print(json.dumps(main(a.only, a.rounds)))
