"""Runs PyTorch's OpInfo samples on neuron and compares them with CPU eager (the oracle).

Samples are generated on `neuron`, as PyTorch's device-generic tests generate them on the
device under test (sample functions decide which arguments stay on the host); the CPU
reference runs on copies moved to CPU.
"""

import torch
from torch.testing._internal.common_methods_invocations import op_db

# OpInfos left out, each with its reason.
EXCLUDED = {
    "empty": "returns uninitialised memory: nothing to compare",
    "empty_like": "returns uninitialised memory: nothing to compare",
    "new_empty": "returns uninitialised memory: nothing to compare",
    "empty_permuted": "returns uninitialised memory: nothing to compare",
    "new_empty_strided": "returns uninitialised memory: nothing to compare",
    "empty_strided": "returns uninitialised memory: nothing to compare",
    "as_strided.partial_views": "reads storage outside the view; a copied sample holds only the view",
    "to_sparse": "sparse layouts are not supported on neuron (strided tensors only)",
    "sparse.sampled_addmm": "sparse layouts are not supported on neuron (strided tensors only)",
    "sparse.mm.reduce": "sparse layouts are not supported on neuron (strided tensors only)",
}

# Ops whose CPU kernel choice depends on the device type, so neuron legitimately takes
# another (equally valid) path: compared within float32 tolerance instead of bit for bit,
# and without strides (the other driver lays its solution out otherwise).
TOLERANT = {
    "linalg.lstsq": "the default LAPACK driver is chosen by device type (gelsy on CPU only)",
    "linalg.lstsq.grad_oriented": "the default LAPACK driver is chosen by device type",
}


def to_cpu(x):
    if isinstance(x, torch.Tensor):
        return x.detach().cpu() if x.device.type == "neuron" else x
    if isinstance(x, (list, tuple)):
        return type(x)(to_cpu(e) for e in x)
    if isinstance(x, dict):
        return {k: to_cpu(v) for k, v in x.items()}
    if isinstance(x, torch.device) and x.type == "neuron":
        return torch.device("cpu")
    if isinstance(x, str) and x.startswith("neuron"):
        return "cpu"
    return x


def float32_ops():
    out = []
    for op in op_db:
        try:
            if torch.float32 in op.supported_dtypes("cpu"):
                out.append(op)
        except Exception:  # an OpInfo whose dtype query fails on this build
            pass
    return out


def op_id(op):
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


def compare(expected, actual, path="out", exact=True):
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{path}: expected a tensor, got {type(actual)}"
        assert actual.device.type == expected.device.type or actual.device.type == "neuron", (
            f"{path}: result on {actual.device}")
        if exact and expected.layout == torch.strided and expected.numel() > 0:
            # Strides too (dims of size 1 carry no layout): ops after this one reduce
            # in another order per layout, so a layout CPU does not give drifts later.
            assert _layout(actual) == _layout(expected), (
                f"{path}: strides {actual.stride()} on neuron, {expected.stride()} on CPU "
                f"(shape {tuple(expected.shape)})")
        actual = actual.cpu()
        assert expected.shape == actual.shape, f"{path}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
        assert expected.dtype == actual.dtype, f"{path}: dtype {actual.dtype} != {expected.dtype}"
        kw = dict(rtol=0, atol=0) if exact else {}
        torch.testing.assert_close(actual, expected, equal_nan=True, msg=lambda m: f"{path}: {m}", **kw)
    elif isinstance(expected, (list, tuple)):
        assert len(expected) == len(actual), f"{path}: length {len(actual)} != {len(expected)}"
        for i, (e, a) in enumerate(zip(expected, actual)):
            compare(e, a, f"{path}[{i}]", exact)
    elif isinstance(expected, float) and expected != expected:
        assert actual != actual, f"{path}: {actual!r} != nan"
    else:
        assert expected == actual, f"{path}: {actual!r} != {expected!r}"


def _layout(t):
    return tuple(st for st, n in zip(t.stride(), t.shape) if n > 1)


def run_op(op):
    """Runs every float32 sample; returns how many were compared."""
    exact = op_id(op) not in TOLERANT
    torch.manual_seed(0)
    samples = list(op.sample_inputs("neuron", torch.float32, requires_grad=False))
    compared = 0
    for sample in samples:
        cpu_input, cpu_args, cpu_kwargs = to_cpu(sample.input), to_cpu(sample.args), to_cpu(sample.kwargs)
        torch.manual_seed(1234)
        try:
            expected = op(cpu_input, *cpu_args, **cpu_kwargs)
        except Exception:
            continue  # the sample does not run on CPU either
        torch.manual_seed(1234)
        actual = op(sample.input, *sample.args, **sample.kwargs)
        try:
            compare(to_cpu(expected), actual, exact=exact)
        except AssertionError:
            # Random on CPU itself (two seeded CPU runs differ)? Then only geometry counts.
            torch.manual_seed(1234)
            again = op(cpu_input, *cpu_args, **cpu_kwargs)
            try:
                compare(to_cpu(expected), to_cpu(again))
            except AssertionError:
                compare(_geometry(expected), _geometry(actual))
                compared += 1
                continue
            raise
        compared += 1
    torch.neuron.synchronize()
    return compared


def _geometry(x):
    if isinstance(x, torch.Tensor):
        return (tuple(x.shape), x.dtype)
    if isinstance(x, (list, tuple)):
        return [_geometry(e) for e in x]
    return x
