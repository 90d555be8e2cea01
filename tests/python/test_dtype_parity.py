"""Accelerator dtype parity (issue 24 item 2): every op/dtype pair of PyTorch's OpInfo
database that CUDA supports and the CPU dtype list does not, with what covers it on neuron.

The pairs are computed from op_db (supported_dtypes('cuda') - supported_dtypes('cpu')), and
each must be in TABLE, so a torch upgrade that adds pairs fails here until they are sorted:
- "cpu": the CPU kernel has the dtype after all (OpInfo's CPU list is conservative):
  neuron runs it and equals CPU eager bit for bit.
- "route": the CPU kernel lacks it; engine/dtype_routes.cpp gives CUDA's result, checked
  against a reference of CUDA's definition (REFERENCES).
- "missing": not covered, with the reason; neuron must fail with an error naming the op or
  the dtype (never run silently elsewhere), and samples that CPU runs still match CPU.
"""

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db

from opinfo_util import compare, op_id, to_cpu

CPU_HAS_IT = "CPU kernel takes it; OpInfo's CPU list is conservative"
FLOAT_ROUTE = "route: float32 on neuron, rounded back (CUDA accumulates these in float)"
COMPLEX32 = ("missing: ATen's CPU kernels have no complex32 arithmetic; no HF model or training "
             "path uses it (a complex64 route would give CUDA's opmath result)")
FFT_HALF = ("missing: MKL FFT has no half; cuFFT computes half transforms in half precision "
            "(power-of-two sizes only), which a float32 route would not reproduce")

TABLE = {
    **{f"{name}:complex32": COMPLEX32 for name in (
        "acos", "acosh", "asin", "asinh", "atan", "atanh", "cos", "cosh", "div.no_rounding_mode",
        "true_divide", "exp", "log", "logaddexp", "pow", "sin", "sinh", "tan", "tanh", "rsqrt",
        "sqrt", "lerp", "angle", "sigmoid", "prod", "sum", "trace", "nanmean", "nansum")},
    **{f"{name}:complex32": FFT_HALF for name in (
        "fft.fft", "fft.fft2", "fft.fftn", "fft.hfft", "fft.hfft2", "fft.hfftn", "fft.ifft",
        "fft.ifft2", "fft.ifftn", "fft.irfft", "fft.irfft2", "fft.irfftn")},
    **{f"{name}:float16": FFT_HALF for name in (
        "fft.fft", "fft.fft2", "fft.fftn", "fft.hfft", "fft.hfft2", "fft.hfftn", "fft.ifft",
        "fft.ifft2", "fft.ifftn", "fft.irfft", "fft.irfft2", "fft.irfftn", "fft.rfft",
        "fft.rfft2", "fft.rfftn", "fft.ihfft", "fft.ihfft2", "fft.ihfftn")},
    **{f"{name}:complex32": CPU_HAS_IT for name in (
        "diag", "nn.functional.conv1d", "nn.functional.conv2d", "nn.functional.conv3d",
        "nn.functional.conv_transpose1d", "nn.functional.conv_transpose2d",
        "nn.functional.conv_transpose3d")},
    **{f"nn.functional.batch_norm.without_cudnn:{d}": CPU_HAS_IT
       for d in ("bfloat16", "float16", "float32", "float64")},
    **{f"{name}:float16": CPU_HAS_IT for name in (
        "round.decimals_3", "round.decimals_neg_3", "polygamma.polygamma_n_1",
        "polygamma.polygamma_n_2", "polygamma.polygamma_n_3", "polygamma.polygamma_n_4")},
    **{f"histc:{d}": "route: neuron::histc_int, CUDA's integer histogram (int64 bin arithmetic)"
       for d in ("int8", "int16", "int32", "int64", "uint8")},
    **{f"{name}:{d}": FLOAT_ROUTE
       for name in ("nn.functional.avg_pool3d", "_upsample_bilinear2d_aa",
                    "nn.functional.multi_margin_loss", "nn.functional.multilabel_margin_loss")
       for d in ("bfloat16", "float16")},
    "abs:bool": "route: abs of a bool is a copy, as CUDA's kernel",
    "nn.functional.softsign:bool": "route: through abs's bool route (softsign is x / (1 + |x|))",
    "nansum:complex64": "route: NaN-part values count as zero, as CUDA's nansum",
    "nansum:complex128": "route: NaN-part values count as zero, as CUDA's nansum",
    "nanmean:complex64": "route: nanmean is nansum / count (through nansum's route)",
    "nanmean:complex128": "route: nanmean is nansum / count (through nansum's route)",
    "trace:bool": "route: the diagonal's sum (int64), as CUDA's trace",
    "nn.functional.rrelu:float16": (
        "missing: rrelu_with_noise has no CPU half kernel (training samples); its noise is drawn "
        "in half by CUDA's generator, which a float32 route cannot reproduce"),
    "torch.ops.aten._flash_attention_forward:float16": (
        "missing: a CUDA-only kernel; SDPA on neuron follows CPU's kernel choice and never calls it"),
    "torch.ops.aten._efficient_attention_forward:float16": (
        "missing: a CUDA-only kernel; SDPA on neuron follows CPU's kernel choice and never calls it"),
    "torch.ops.aten._efficient_attention_forward:float32": (
        "missing: a CUDA-only kernel; SDPA on neuron follows CPU's kernel choice and never calls it"),
}

MAX_SAMPLES = 4


def cuda_only_pairs():
    pairs = []
    for op in op_db:
        try:
            extra = set(op.supported_dtypes("cuda")) - set(op.supported_dtypes("cpu"))
        except Exception:  # an OpInfo whose dtype query fails on this build
            continue
        for dtype in sorted(extra, key=str):
            pairs.append((op, dtype))
    return pairs


PAIRS = cuda_only_pairs()


def pair_id(pair):
    op, dtype = pair
    return f"{op_id(op)}:{str(dtype).removeprefix('torch.')}"


def histc_reference(x, bins=100, min=0, max=0):
    info = torch.iinfo(x.dtype)
    span = info.max - info.min + 1
    wrap = lambda v: (int(v) - info.min) % span + info.min  # noqa: E731
    values = [int(v) for v in x.flatten().tolist()]
    lo, hi = wrap(int(min)), wrap(int(max))
    if int(min) == int(max) and values:
        lo, hi = sorted(values)[0], sorted(values)[-1]
    if lo == hi:
        lo, hi = wrap(lo - 1), wrap(hi + 1)
    counts = [0] * bins
    for v in values:
        if lo <= v <= hi:
            b = (v - lo) * bins // (hi - lo)
            counts[b - 1 if b == bins else b] += 1
    return torch.tensor(counts, dtype=torch.int64).to(x.dtype)


def float_reference(op, dtype, sample):
    up = lambda t: t.float() if isinstance(t, torch.Tensor) and t.dtype == dtype else t  # noqa: E731
    args = [up(a) for a in to_cpu(sample.args)]
    kwargs = {k: up(v) for k, v in to_cpu(sample.kwargs).items()}
    out = op(up(to_cpu(sample.input)), *args, **kwargs)
    down = lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.dtype == torch.float32 else t  # noqa: E731
    return tuple(down(t) for t in out) if isinstance(out, tuple) else down(out)


def route_reference(name, op, dtype, sample):
    x = to_cpu(sample.input)
    args, kwargs = to_cpu(sample.args), to_cpu(sample.kwargs)
    if name == "histc":
        return histc_reference(x, *args, **kwargs)
    if name == "abs":
        return x.clone()
    if name == "nn.functional.softsign":
        return x / (1 + x)
    if name == "trace":
        return x.diagonal().sum()
    if name == "nansum":
        return x.masked_fill(x.isnan(), 0).sum(*args, **kwargs)
    if name == "nanmean":
        kept = ~x.isnan()
        return x.masked_fill(~kept, 0).sum(*args, **kwargs) / kept.sum(*args, **kwargs)
    return float_reference(op, dtype, sample)


def samples(op, dtype):
    torch.manual_seed(0)
    return list(op.sample_inputs("neuron", dtype, requires_grad=False))[:MAX_SAMPLES]


def run_on(op, sample, cpu):
    if cpu:
        return op(to_cpu(sample.input), *to_cpu(sample.args), **to_cpu(sample.kwargs))
    out = op(sample.input, *sample.args, **sample.kwargs)
    torch.neuron.synchronize()
    return out


def test_every_pair_is_in_the_table():
    ids = {pair_id(p) for p in PAIRS}
    assert ids - TABLE.keys() == set(), "pairs nobody classified"
    assert TABLE.keys() - ids == set(), "table rows OpInfo no longer lists"
    assert len(PAIRS) > 50  # guards against a silently empty sweep


@pytest.mark.parametrize("pair", PAIRS, ids=pair_id)
def test_pair(pair):
    op, dtype = pair
    status = TABLE[pair_id(pair)]
    dtype_name = {torch.float16: "Half", torch.bfloat16: "BFloat16", torch.complex32: "ComplexHalf"}.get(
        dtype, str(dtype).removeprefix("torch."))
    cpu_failures = 0
    for sample in samples(op, dtype):
        try:
            expected = run_on(op, sample, cpu=True)
        except Exception as error:
            expected = None
            cpu_error = str(error).splitlines()[0]
            cpu_failures += 1
        if status.startswith("route"):
            assert expected is None, f"CPU runs {pair_id(pair)} now: the route can go"
            expected = route_reference(op.name, op, dtype, sample)
            compare(expected, run_on(op, sample, cpu=False))
        elif expected is not None:
            compare(to_cpu(expected), run_on(op, sample, cpu=False))
        else:
            with pytest.raises(Exception) as failure:
                run_on(op, sample, cpu=False)
            # CPU eager's own error, or a worker error naming the aten op and the dtype.
            message = str(failure.value)
            named = "failed on neuron" in message and "aten::" in message and dtype_name in message
            assert cpu_error in message or named, message
    if status == CPU_HAS_IT:
        assert cpu_failures == 0, f"CPU no longer runs {pair_id(pair)}"
    elif status.startswith("missing"):
        assert cpu_failures > 0, f"CPU runs {pair_id(pair)} now: update the table"


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64])
def test_histc_integer_cases(dtype):
    g = torch.Generator().manual_seed(3)
    lo = 0 if dtype == torch.uint8 else -50
    x = torch.randint(lo, 100, (1000,), generator=g, dtype=torch.int64).to(dtype)
    cases = [dict(bins=7, min=0, max=0),           # bounds from the data
             dict(bins=5, min=10, max=40),          # values outside [min, max] are dropped
             dict(bins=3, min=2.9, max=77.6),       # scalars truncated to the input type
             dict(bins=300, min=0, max=99)]         # more bins than values in range
    for kwargs in cases:
        got = torch.histc(x.to("neuron"), **kwargs)
        assert got.device.type == "neuron" and got.dtype == dtype
        compare(histc_reference(x, **kwargs), got)
    same = torch.full((9,), 5, dtype=dtype)            # all equal: widened to [4, 6]
    compare(histc_reference(same, bins=4), torch.histc(same.to("neuron"), bins=4))
    out = torch.empty(0, dtype=dtype, device="neuron")
    torch.histc(x.to("neuron"), bins=6, min=0, max=60, out=out)
    compare(histc_reference(x, bins=6, min=0, max=60), out)
    with pytest.raises(RuntimeError, match="bins must be > 0"):
        torch.histc(x.to("neuron"), bins=0)
    with pytest.raises(RuntimeError, match="max must be larger than min"):
        torch.histc(x.to("neuron"), bins=4, min=5, max=1)
