"""Ops whose ATen out= variant would run the functional kernel and copy (native_layer_norm
and its backward) write straight into the device outputs
(backend/direct_out.h): bit-equal to CPU eager on the direct path and on its fallback
(inputs or outputs the kernel cannot take as they are), and the counters say which ran."""

import pytest
import torch  # autoloads neuron_eager; must come first (see test_device_module)
import torch.nn.functional as F

import neuron_eager


def runs():
    c = neuron_eager.counters()
    return c.get("direct_out_runs", 0), c.get("direct_out_copies", 0)


def check(fn, *cpu_args, direct=True):
    """fn on CPU and on neuron with the same arguments: equal bits, and the direct path
    (or its fallback) counted."""
    want = fn(*cpu_args)
    dev_args = [a.to("neuron") if isinstance(a, torch.Tensor) else a for a in cpu_args]
    before = runs()
    got = fn(*dev_args)
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got, want):
        if w is None:
            assert g is None
            continue
        g = g.cpu()
        assert g.dtype == w.dtype and g.shape == w.shape and g.stride() == w.stride()
        assert torch.equal(g.contiguous().view(-1).view(torch.uint8), w.contiguous().view(-1).view(torch.uint8))
    after = runs()
    if direct:
        assert after[0] > before[0], "the direct kernel did not run"
    else:
        assert after[1] > before[1], "the fallback did not run"


@pytest.mark.parametrize("shape,affine", [((64, 96), True), ((3, 5, 200), False), ((7, 33), True)])
def test_layer_norm_forward(shape, affine):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(*shape, generator=g) * 3 + 1
    w = torch.randn(shape[-1], generator=g) if affine else None
    b = torch.randn(shape[-1], generator=g) if affine else None
    check(lambda x, w, b: torch.native_layer_norm(x, (shape[-1],), w, b, 1e-5), x, w, b)


def test_layer_norm_non_contiguous_input_falls_back():
    x = torch.randn(40, 64).t()  # 64 rows of 40, transposed: not contiguous
    check(lambda x: torch.native_layer_norm(x, (40,), None, None, 1e-5), x, direct=False)


def test_layer_norm_mixed_bf16_input():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(16, 128, generator=g).bfloat16()
    w, b = torch.randn(128, generator=g), torch.randn(128, generator=g)
    check(lambda x, w, b: torch.native_layer_norm(x, (128,), w, b, 1e-6), x, w, b)


def test_layer_norm_backward_through_autograd():
    g = torch.Generator().manual_seed(3)
    x0 = torch.randn(32, 80, generator=g)
    w0, b0 = torch.randn(80, generator=g), torch.randn(80, generator=g)
    gy = torch.randn(32, 80, generator=g)

    def grads(device):
        x = x0.to(device).requires_grad_()
        w = w0.to(device).requires_grad_()
        b = b0.to(device).requires_grad_()
        y = F.layer_norm(x, (80,), w, b)
        y.backward(gy.to(device))
        return [t.grad.cpu() for t in (x, w, b)]

    before = runs()
    got, want = grads("neuron"), grads("cpu")
    assert runs()[0] >= before[0] + 2  # forward and backward
    for g_, w_ in zip(got, want):
        assert torch.equal(g_, w_)


def test_layer_norm_backward_non_contiguous_grad_falls_back():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(24, 48, generator=g)
    w, b = torch.randn(48, generator=g), torch.randn(48, generator=g)
    _, mean, rstd = torch.native_layer_norm(x, (48,), w, b, 1e-5)
    gy = torch.randn(48, 24, generator=g).t()
    check(lambda gy, x, mean, rstd, w, b: torch.ops.aten.native_layer_norm_backward(
        gy, x, (48,), mean, rstd, w, b, [True, True, True]), gy, x, mean, rstd, w, b, direct=False)
