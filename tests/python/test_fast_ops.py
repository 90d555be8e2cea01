"""The unboxed entry points of the hottest ops (engine/fast_ops.cpp): their tensor
arguments reach the fallback as borrowed values, so these tests check that no reference
is lost or kept, on the queued path, the synchronous path and the error paths, and that
results and returned objects are CPU eager's."""

import gc
import sys
import weakref

import pytest
import torch

import neuron_eager  # noqa: F401


def pair(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g)
    return x, x.to("neuron")


def test_fast_ops_match_cpu_and_keep_references():
    xc, x = pair(8, 8, seed=1)
    yc, y = pair(8, 8, seed=2)
    bc, b = pair(8, seed=3)
    before = (sys.getrefcount(x), sys.getrefcount(y), sys.getrefcount(b))
    for _ in range(3):
        cases = [
            (lambda p, q, v: p + q), (lambda p, q, v: p - q * 2), (lambda p, q, v: p * q),
            (lambda p, q, v: p / (q.abs() + 1)), (lambda p, q, v: torch.mm(p, q)),
            (lambda p, q, v: torch.addmm(v, p, q)), (lambda p, q, v: torch.bmm(p[None], q[None])),
            (lambda p, q, v: torch.relu(p)), (lambda p, q, v: torch.nn.functional.gelu(p)),
            (lambda p, q, v: torch.nn.functional.silu(p)), (lambda p, q, v: p.tanh().sigmoid()),
            (lambda p, q, v: p.exp().neg()), (lambda p, q, v: (p.abs() + 1).rsqrt().pow(3)),
            (lambda p, q, v: p.mean(1)), (lambda p, q, v: p.sum(0)), (lambda p, q, v: p.softmax(1)),
            (lambda p, q, v: p.log_softmax(0)), (lambda p, q, v: torch.where(p > 0, p, q)),
        ]
        for fn in cases:
            assert torch.equal(fn(x, y, b).cpu(), fn(xc, yc, bc))
    assert (sys.getrefcount(x), sys.getrefcount(y), sys.getrefcount(b)) == before


def test_in_place_fast_ops_return_their_argument():
    xc, x = pair(4, 5)
    yc, y = pair(4, 5, seed=1)
    for name, args in [("add_", (y,)), ("sub_", (y,)), ("mul_", (y,)), ("div_", (y.abs() + 1,)),
                       ("addcmul_", (y, y))]:
        r = getattr(x, name)(*args)
        assert r is x, name
        getattr(xc, name)(*[a.cpu() for a in args])
    assert torch.equal(x.cpu(), xc)


def test_arguments_are_freed_after_fast_ops():
    _, x = pair(64, 64)
    _, y = pair(64, 64, seed=1)
    torch.neuron.synchronize()
    start = torch.neuron.memory_allocated()
    for _ in range(20):
        z = torch.mm(x, y) + x
        x.mul_(0.5)
    del z
    wx, wy = weakref.ref(x), weakref.ref(y)
    del x, y
    gc.collect()
    torch.neuron.synchronize()
    assert wx() is None and wy() is None  # no reference kept by the fast path
    assert torch.neuron.memory_allocated() < start


def test_errors_on_the_fast_path_leave_arguments_intact():
    xc, x = pair(3, 4)
    yc, y = pair(5, 6, seed=1)
    before = (sys.getrefcount(x), sys.getrefcount(y))
    with pytest.raises(RuntimeError) as info:
        torch.mm(x, y)  # shape error: meta inference fails, the CPU kernel raises
    with pytest.raises(RuntimeError) as cpu_info:
        torch.mm(xc, yc)
    assert str(cpu_info.value).splitlines()[0] in str(info.value)
    with pytest.raises(RuntimeError):
        x + y  # shapes that do not broadcast
    assert (sys.getrefcount(x), sys.getrefcount(y)) == before
    assert torch.equal((x * 2).cpu(), xc * 2)
    assert torch.equal(y.sum(0).cpu(), yc.sum(0))


def test_cpu_scalars_and_wrapped_numbers_on_the_fast_path():
    xc, x = pair(6)
    s = torch.tensor(2.5)
    assert torch.equal((x + s).cpu(), xc + s)
    assert torch.equal((x * 3).cpu(), xc * 3)
    assert torch.equal(torch.where(x > 0, x, torch.tensor(0.0)).cpu(),
                       torch.where(xc > 0, xc, torch.tensor(0.0)))
