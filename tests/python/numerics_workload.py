"""Fast and exact numerics on tier 2, in a child process (test_numerics.py): a LayerNorm ->
GELU -> residual block, and GELU alone over random and adversarial inputs, with every group
compiled. Prints a JSON summary: the block's largest difference from CPU eager, GELU's
largest error in float32 ulps against a float64 reference, and the native counters.

    python tests/python/numerics_workload.py exact|fast
"""

import json
import sys

import torch
import torch.nn.functional as F

import neuron_eager


def ulps(got, ref64):
    """Errors of float32 `got` against a float64 reference, in float32 ulps of
    max(|reference|, 1): relative above 1, absolute (in ulps of 1.0, 2**-23) below, where
    GELU's 1 + erf(x) cancels in any float32 evaluation (ATen's own float32 GELU is
    8e6 ulps off at x = -5.5 in plain ulps)."""
    mag = ref64.abs().clamp_min(1.0).to(torch.float32)
    ulp = (torch.nextafter(mag, torch.tensor(float("inf"))) - mag).to(torch.float64)
    return (got.to(torch.float64) - ref64).abs() / ulp


def run_rounds(fn, x, rounds=8):
    xd = x.to("neuron")
    out = None
    for r in range(rounds):
        out = fn(xd).cpu()
        if r == 2:
            neuron_eager._C.native_wait_idle()
    return out


def main(mode):
    neuron_eager.set_mode("adaptive")
    # Every segment ends at a host read (rolling_bits 0: no content cuts), so which groups
    # reach tier 2 does not hang on where the rolling hash happens to cut a 2-op loop body.
    neuron_eager.set_policy({"base": "default", "numerics": mode, "tier": "native", "hot_threshold": 2,
                             "native_min_runs": 1, "min_group_elements": 0, "guard": False,
                             "rolling_bits": 0})
    g = torch.Generator().manual_seed(0)
    d = 256
    w, b = torch.randn(d, generator=g), torch.randn(d, generator=g)

    def block(x):
        h = F.layer_norm(x, (d,), w.to(x.device), b.to(x.device), 1e-5)
        return F.gelu(h) * 1.5 + x

    x = torch.randn(64, d, generator=g)
    want = block(x)
    got = run_rounds(block, x)
    result = {"mode": mode, "block_equal": bool(torch.equal(got, want)),
              "block_max_abs": float((got - want).abs().max()),
              "block_max_rel": float(((got - want).abs() / want.abs().clamp_min(1e-6)).max())}
    # GELU alone (times 1: exact), erf and tanh forms, on random values and the edges.
    edges = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 1e-6, -1e-6, 0.5, -0.5, 3.0, -3.0, 5.5, -5.5, 9.0, -9.0,
                          10.0, -10.0, 20.0, -20.0, 1e4, -1e4, 1e30, -1e30])
    xs = torch.cat([torch.randn(65536 - edges.numel(), generator=g) * 4, edges])
    for form in ("none", "tanh"):
        fn = lambda t, form=form: F.gelu(t, approximate=form) * 1.0  # noqa: E731
        runs = neuron_eager.counters()["native_runs"]
        got = run_rounds(fn, xs)
        result[f"gelu_{form}_tier2_runs"] = neuron_eager.counters()["native_runs"] - runs
        ref = F.gelu(xs.double(), approximate=form)
        aten = fn(xs)  # CPU eager's own float32 result, for comparison
        finite = torch.isfinite(ref)
        result[f"gelu_{form}_max_ulps"] = float(ulps(got[finite], ref[finite]).max())
        result[f"gelu_{form}_aten_max_ulps"] = float(ulps(aten[finite], ref[finite]).max())
    neuron_eager.set_policy("default")
    neuron_eager.set_mode("eager")
    result["counters"] = {k: v for k, v in neuron_eager.counters().items() if k.startswith("native")}
    return result


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
