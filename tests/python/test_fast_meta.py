"""Output geometry in C++ (engine/fast_meta.cpp): ops whose Meta kernel torch replaced with
a Python one get their output shapes, strides and dtypes from ATen's structured meta
functions or our rules. Every case is checked against CPU eager (values, shapes, strides,
dtypes) with shapes the shape cache has never seen, so the fast path is what ran."""

import copy
import itertools

import pytest
import torch  # autoloads neuron_eager; must come first (see test_device_module)
import torch.nn.functional as F

import neuron_eager

aten = torch.ops.aten
_sizes = itertools.count(3)


def fresh(*shape, dtype=torch.float32, positive=False):
    """A tensor of a shape no earlier case used (the last dim grows), so the shape cache
    misses and the fast path runs."""
    n = next(_sizes)
    shape = (*shape, n) if shape else (n,)
    if dtype.is_floating_point:
        t = torch.rand(shape, dtype=dtype) + 0.5 if positive else torch.randn(shape, dtype=dtype)
    elif dtype == torch.bool:
        t = torch.rand(shape) > 0.5
    else:
        t = torch.randint(-5, 6, shape, dtype=dtype)
    return t


def check(fn, *cpu_args):
    torch.neuron.synchronize()
    neuron_eager._C.clear_shape_cache()  # the shapes may have been seen by earlier tests
    dev_args = [a.to("neuron") if isinstance(a, torch.Tensor) and a.dim() > 0 else a for a in cpu_args]
    before = neuron_eager.counters()["fast_meta_runs"]
    want = fn(*cpu_args)
    got = fn(*dev_args)
    ran_fast = neuron_eager.counters()["fast_meta_runs"] - before
    wants = want if isinstance(want, (tuple, list)) else (want,)
    gots = got if isinstance(got, (tuple, list)) else (got,)
    assert len(wants) == len(gots)
    for w, g in zip(wants, gots):
        if w is None:  # an output the mask turned off
            assert g is None
            continue
        assert g.device.type == "neuron"
        assert (g.shape, g.stride(), g.dtype) == (w.shape, w.stride(), w.dtype)
        torch.testing.assert_close(g.cpu(), w, rtol=1e-5, atol=1e-6, equal_nan=True)
    return ran_fast


def check_after_clone(fn, x, *rest):
    """check() of fn(x, ...) less the fast runs of cloning x (its copy_ runs a rule too)."""
    return check(fn, x, *rest) - check(lambda t: t.clone(), x)


def test_table_matches_registered_schemas():
    ops = neuron_eager._C.fast_meta_ops()
    assert neuron_eager._C.fast_meta_mismatches() == []
    assert len(ops) >= 90
    for name in ("aten::mul.Tensor", "aten::add_.Tensor", "aten::addmm", "aten::gelu_backward",
                 "aten::native_layer_norm", "aten::native_layer_norm_backward", "aten::cat"):
        assert name in ops


UNARY = ["sqrt", "rsqrt", "exp", "log", "tanh", "sigmoid", "neg", "cos", "sin", "silu", "reciprocal"]


@pytest.mark.parametrize("name", UNARY)
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_unary(name, layout):
    x = fresh(4, positive=True)
    if layout == "transposed":
        x = x.t()
    assert check(getattr(aten, name).default, x) == 1
    clone = check(lambda t: t.clone(), x)  # its copy_ may run a rule too
    assert check(lambda t: getattr(aten, name + "_").default(t.clone()), x) == clone + 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "row slice"])
def test_abs_out_rule(dtype, layout):
    # aten::abs is composite: it reaches the device as abs.out into a fresh empty tensor.
    x = fresh(5, 4, dtype=dtype)
    x = {"contiguous": x, "transposed": x.transpose(0, 2), "row slice": x[1:4]}[layout]
    assert check(torch.abs, x) == 1
    if dtype.is_floating_point:
        assert check(lambda t: torch.log(t.abs().float() + 1), x) >= 1


def test_abs_out_of_complex_or_into_a_shaped_out_uses_the_meta_kernel():
    z = torch.randn(3, next(_sizes), dtype=torch.complex64)
    assert check(torch.abs, z) == 0  # complex -> float32 output
    x = fresh(3)
    assert check(lambda t: torch.abs(t, out=torch.empty(t.shape, dtype=t.dtype, device=t.device)), x) == 0


@pytest.mark.parametrize("case", ["same", "broadcast row", "to bf16", "into a transposed view"])
def test_copy_rule(case):
    x = fresh(4)
    n = x.shape[1]

    def run(t):
        if case == "same":
            return torch.zeros_like(t).copy_(t)
        if case == "broadcast row":
            return torch.zeros_like(t).copy_(t[0])
        if case == "to bf16":
            return t.to(torch.bfloat16)
        return torch.zeros(n, 4, device=t.device).t().copy_(t)

    before = neuron_eager.counters()
    assert check(run, x) >= 1
    after = neuron_eager.counters()
    # Every shape inference of the case ran in C++ (zeros_like's zero_ and the copy_).
    assert after["meta_runs"] - before["meta_runs"] == after["fast_meta_runs"] - before["fast_meta_runs"]


def test_copy_errors_raise_as_on_cpu():
    x = fresh(4)
    xd = x.to("neuron")
    with pytest.raises(RuntimeError) as on_cpu:
        torch.zeros(3, x.shape[1]).copy_(x)
    with pytest.raises(RuntimeError) as on_neuron:
        torch.zeros(3, x.shape[1], device="neuron").copy_(xd)
    assert str(on_cpu.value).split("\n")[0] in str(on_neuron.value)
    torch.neuron.synchronize()  # nothing was queued that fails later


BINARY = [("mul", "Tensor"), ("div", "Tensor"), ("eq", "Tensor"), ("ne", "Tensor"), ("lt", "Tensor"),
          ("le", "Tensor"), ("gt", "Tensor"), ("ge", "Tensor"), ("maximum", "default"),
          ("minimum", "default"), ("pow", "Tensor_Tensor"), ("clamp_min", "Tensor")]


@pytest.mark.parametrize("name,overload", BINARY)
def test_binary_broadcast_and_promotion(name, overload):
    a = fresh(5, positive=True)
    op = getattr(getattr(aten, name), overload)
    assert check(op, a, a[0].clone()) == 1                 # broadcast a row
    assert check(op, a.t(), a.t().contiguous()) == 1       # permuted operand: CPU's strides
    assert check(op, a, torch.tensor(2.0)) == 1            # CPU scalar operand
    ints = torch.randint(1, 4, a.shape, dtype=torch.int64)
    assert check(op, ints, a) == 1                         # int64 with float32


def test_alpha_ops_inplace_and_ternary():
    a = fresh(3)
    b = torch.randn(a.shape)
    assert check(lambda x, y: aten.add.Tensor(x, y, alpha=0.5), a, b) == 1
    assert check(lambda x, y: aten.sub.Tensor(x, y, alpha=2), a, b) == 1
    assert check_after_clone(lambda x, y: x.clone().add_(y, alpha=3), a, b) == 1
    assert check_after_clone(lambda x, y: x.clone().mul_(y), a, b) == 1
    assert check(lambda x, y: torch.lerp(x, y, 0.3), a, b) == 1
    assert check_after_clone(lambda x, y: x.clone().lerp_(y, 0.3), a, b) == 1
    assert check(lambda x, y: torch.addcmul(x, x, y, value=0.5), a, b) == 1
    assert check_after_clone(lambda x, y: x.clone().addcdiv_(x, y, value=-2), a, b.abs() + 1) == 1
    assert check(lambda x: torch.pow(x, 2), a) == 1
    assert check(lambda x: torch.clamp(x, min=-0.5, max=0.5), a) == 1
    assert check(lambda x: torch.clamp_min(x, 0.1), a) == 1
    assert check(lambda x: x == 0.5, a) == 1
    ints = fresh(2, dtype=torch.int32)
    assert check(lambda x: ~x, ints) == 1
    assert check_after_clone(lambda x: x.clone().zero_(), a.t()) == 1
    assert check_after_clone(lambda x: x.clone().fill_(2.5), a) == 1
    assert check(lambda x, y: x & y, ints, ints.flip(0)) == 1
    assert check(lambda x, y: x | y, ints, ints.flip(0)) == 1


def test_activation_backwards():
    x = fresh(6)
    g = torch.randn(x.shape)
    assert check(lambda g, x: aten.gelu_backward(g, x), g, x) == 1
    assert check(lambda g, x: aten.gelu_backward(g, x, approximate="tanh"), g, x) == 1
    assert check(lambda x: F.gelu(x, approximate="tanh"), x) == 1
    assert check(aten.silu_backward.default, g, x) == 1
    assert check(aten.sigmoid_backward.default, g, x.sigmoid()) == 1
    assert check(aten.tanh_backward.default, g, x.tanh()) == 1
    assert check(lambda g, x: aten.threshold_backward(g, x, 0.0), g, x) == 1


def test_matmuls_reductions_softmax_losses_cat():
    a = fresh(7)
    w = torch.randn(a.shape[1], 5)
    bias = torch.randn(5)
    assert check(torch.mm, a, w) == 1
    assert check(lambda b, x, y: torch.addmm(b, x, y, beta=0.5, alpha=2), bias, a, w) == 1
    assert check(torch.mm, a, w.t().contiguous().t()) == 1
    b3 = fresh(2, 3)
    assert check(torch.bmm, b3, b3.transpose(1, 2)) == 1
    assert check(lambda x: torch.baddbmm(torch.zeros(2, 3, 3), x, x.transpose(1, 2)), b3) == 1
    for dim, keep in ((1, False), (0, True), (-1, True)):
        assert check(lambda x: x.sum(dim, keepdim=keep), a) == 1
        assert check(lambda x: x.mean(dim, keepdim=keep), a) == 1
        assert check(lambda x: x.amax(dim, keepdim=keep), a) == 1
    assert check(lambda x: x.sum(1, dtype=torch.float64), a) == 1
    assert check(lambda x: x.argmax(1), a) == 1
    assert check(lambda x: x.cumsum(1), a) == 1
    assert check(lambda x: torch._log_softmax(x, 1, False), a) == 1
    assert check(lambda x: torch._softmax(x, 0, False), a) == 1
    out = torch._log_softmax(a, 1, False)
    assert check(lambda g, o: aten._log_softmax_backward_data(g, o, 1, torch.float32), torch.randn(a.shape), out) == 1
    sm = torch._softmax(a, 1, False)
    assert check(lambda g, o: aten._softmax_backward_data(g, o, 1, torch.float32), torch.randn(a.shape), sm) == 1
    target = torch.randint(0, a.shape[1], (a.shape[0],))
    assert check(lambda x, t: aten.nll_loss_forward(x, t, None, 1, -100), out, target) == 1
    loss, total = aten.nll_loss_forward(out, target, None, 1, -100)
    assert check(lambda g, x, t, tw: aten.nll_loss_backward(g, x, t, None, 1, -100, tw),
                 torch.tensor(1.0).reshape(()), out, target, total) >= 0
    assert check(lambda x, y: torch.cat([x, y], 1), a, a.flip(0)) == 1
    assert check(lambda x, y: torch.cat([x, y.t()], 0), a[:, :3], a[:3, :].contiguous()) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_layer_norm_rule(dtype):
    x = fresh(3, 4, dtype=dtype)
    n = x.shape[-1]
    w, b = torch.randn(n, dtype=dtype), torch.randn(n, dtype=dtype)
    assert check(lambda x, w, b: aten.native_layer_norm(x, [n], w, b, 1e-5), x, w, b) == 1
    assert check(lambda x: aten.native_layer_norm(x, [4, n], None, None, 1e-5), x) == 1
    assert check(lambda x, w: aten.native_layer_norm(x, [n], w, None, 1e-5), x.transpose(0, 1), w) == 1
    out, mean, rstd = aten.native_layer_norm(x, [n], w, b, 1e-5)
    g = torch.randn(x.shape, dtype=dtype)
    for mask in ([True, True, True], [True, False, False], [False, True, True]):
        assert check(lambda g, x, m, r, w, b: aten.native_layer_norm_backward(g, x, [n], m, r, w, b, mask),
                     g, x, mean, rstd, w, b) == 1


def test_layer_norm_mixed_dtypes_and_bad_shapes_use_the_meta_kernel():
    x = fresh(3, dtype=torch.bfloat16)
    n = x.shape[-1]
    w, b = torch.randn(n), torch.randn(n)  # float32 parameters: statistics in float32
    assert check(lambda x, w, b: aten.native_layer_norm(x, [n], w, b, 1e-5), x, w, b) == 0
    xd, wd = x.to("neuron"), torch.randn(n + 1).to("neuron")
    with pytest.raises(RuntimeError) as on_cpu:
        aten.native_layer_norm(x.float(), [n], torch.randn(n + 1), None, 1e-5)
    with pytest.raises(RuntimeError) as on_neuron:
        aten.native_layer_norm(xd.float(), [n], wd, None, 1e-5)
    assert str(on_cpu.value).split("\n")[0] in str(on_neuron.value)


def test_argument_errors_raise_as_on_cpu():
    a = fresh(3).to("neuron")
    with pytest.raises(RuntimeError, match="must match the size"):
        a * torch.randn(4, a.shape[1] + 1, device="neuron")
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        torch.mm(a, torch.randn(a.shape[1] + 2, 2, device="neuron"))
    torch.neuron.synchronize()  # nothing was queued that fails later


def test_training_step_with_novel_shapes_runs_meta_in_cpp():
    """The shape_change benchmark's pattern: a batch size new every step; no Python meta."""
    neuron_eager._C.clear_shape_cache()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU(), torch.nn.LayerNorm(16),
                                torch.nn.Linear(16, 4))
    dev_model = copy.deepcopy(model).to("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    dev_opt = torch.optim.AdamW(dev_model.parameters(), lr=1e-2)
    x_all, y_all = torch.randn(80, 16), torch.randint(0, 4, (80,))
    for step, rows in enumerate((31, 45, 52, 60, 23)):
        if step == 1:  # after the first step, which creates the optimizer's state
            before = neuron_eager.counters()
        for m, o, dev in ((model, opt, "cpu"), (dev_model, dev_opt, "neuron")):
            o.zero_grad()
            F.cross_entropy(m(x_all[:rows].to(dev)), y_all[:rows].to(dev)).backward()
            o.step()
    after = neuron_eager.counters()
    meta = after["meta_runs"] - before["meta_runs"]
    fast = after["fast_meta_runs"] - before["fast_meta_runs"]
    assert meta > 0 and fast == meta, (meta, fast)
    for p, q in zip(model.parameters(), dev_model.parameters()):
        torch.testing.assert_close(q.cpu(), p, rtol=1e-5, atol=1e-6)
