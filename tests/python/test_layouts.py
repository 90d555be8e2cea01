"""Output layouts equal CPU eager's (issue 24 item 1): every output gets the sizes and the
strides CPU gives it. Values alone are not enough: an op after this one (GroupNorm, a
reduction) reduces in another order per layout, so a layout CPU does not give drifts later.
OpInfo's samples are compared with their strides in test_opinfo; these are the cases its
samples do not reach.
"""

import pytest
import torch

import neuron_eager


@pytest.mark.parametrize("dims", [1, 2, 3])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last_input", "channels_last_weight"])
@pytest.mark.parametrize("transposed", [False, True])
def test_convolution_strides_equal_cpu(dims, layout, transposed):
    """Forward and backward of convolutions: every output has CPU's strides and values."""
    g = torch.Generator().manual_seed(dims)
    x = torch.randn(2, 4, *(6,) * dims, generator=g)
    w = torch.randn(4, 2, *(3,) * dims, generator=g)
    b = torch.randn(4, generator=g)

    def channels_last(t):
        if dims == 1:  # no 3-d memory format: the same idea by a transpose
            return t.transpose(1, 2).contiguous().transpose(1, 2)
        return t.contiguous(memory_format=torch.channels_last if dims == 2 else torch.channels_last_3d)

    if layout == "channels_last_input":
        x = channels_last(x)
    elif layout == "channels_last_weight":
        w = channels_last(w)
    conv = getattr(torch.nn.functional, f"conv{'_transpose' if transposed else ''}{dims}d")

    def run(device):
        xx, ww, bb = (t.detach().to(device).requires_grad_() for t in (x, w, b))
        y = conv(xx, ww, bb, groups=2)
        y.backward(torch.full_like(y, 0.5))
        return [y, xx.grad, ww.grad, bb.grad]

    for i, (e, a) in enumerate(zip(run("cpu"), run("neuron"))):
        assert a.stride() == e.stride(), f"output {i}: strides {a.stride()} on neuron, {e.stride()} on CPU"
        assert torch.equal(a.cpu(), e), f"output {i}: values differ"


@pytest.mark.parametrize("fn", ["rfft2", "hfft2", "fftn", "svd"])
def test_learnt_layouts_queue_after_the_first_call(fn):
    """FFT and LAPACK kernels lay outputs out as no Meta kernel predicts: the first call per
    input geometry runs at once (CPU's layout), later calls with that geometry queue with
    the layout learnt."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 6, 7, generator=g)
    ops = {"rfft2": torch.fft.rfft2, "hfft2": torch.fft.hfft2, "fftn": torch.fft.fftn,
           "svd": lambda t: torch.linalg.svd(t)}
    f = ops[fn]

    def tensors(r):
        return list(r) if isinstance(r, tuple) else [r]

    expected = tensors(f(x))
    runs = []
    for _ in range(2):
        before = neuron_eager.counters()["ops_synchronous"]
        got = tensors(f(x.to("neuron")))
        runs.append(neuron_eager.counters()["ops_synchronous"] - before)
        for e, a in zip(expected, got):
            assert a.stride() == e.stride(), f"{fn}: strides {a.stride()} on neuron, {e.stride()} on CPU"
            assert torch.equal(a.cpu(), e)
    torch.neuron.synchronize()
    assert runs[1] == 0, f"{fn}: the second call with the same geometry ran synchronously"
