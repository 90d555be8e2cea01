"""Views alias device memory; copies between host and cores; dtype conversions."""

import pytest
import torch  # autoloads neuron_eager; must come first (see test_device_module)

import neuron_eager

N0 = torch.device("neuron", 0)
N1 = torch.device("neuron", 1)


def base_pair(*shape, dtype=torch.float32):
    cpu = torch.arange(int(torch.tensor(shape).prod()), dtype=dtype).reshape(shape)
    return cpu, cpu.to("neuron")


def busy(n=3, size=1500):
    """Queues a few big matmuls so that what follows waits in the queue."""
    a = torch.randn(size, size, device="neuron")
    outs = [a @ a for _ in range(n)]
    return outs


# ---- views alias their base -----------------------------------------------------

VIEWS = {
    "view": lambda t: t.view(4, 6),
    "transpose": lambda t: t.transpose(1, 2),
    "slice": lambda t: t[:, 1:3, ::2],
    "select": lambda t: t.select(1, 2),
    "unfold": lambda t: t.unfold(2, 2, 1),
    "as_strided": lambda t: t.as_strided((3, 2), (5, 3), 1),
    "diagonal": lambda t: t.diagonal(0, 1, 2),
    "permute": lambda t: t.permute(2, 0, 1),
    "flatten_view": lambda t: t.reshape(-1),
}


@pytest.mark.parametrize("name", list(VIEWS))
def test_view_values_and_alias(name):
    cpu, dev = base_pair(2, 3, 4)
    fn = VIEWS[name]
    v = fn(dev)
    assert v.device.type == "neuron"
    assert v._is_view() and v._base is dev
    assert v.untyped_storage().data_ptr() == dev.untyped_storage().data_ptr()
    assert v.shape == fn(cpu).shape and v.stride() == fn(cpu).stride()
    torch.testing.assert_close(v.cpu(), fn(cpu))
    # in-place through the view mutates the base, exactly as on CPU
    fn(cpu).mul_(-2).add_(1)
    v.mul_(-2).add_(1)
    torch.testing.assert_close(dev.cpu(), cpu)


def test_expand_aliases_and_reads():
    cpu = torch.tensor([[1.0], [2.0], [3.0]])
    dev = cpu.to("neuron")
    e = dev.expand(3, 5)
    assert e.stride() == (1, 0)
    assert e.untyped_storage().data_ptr() == dev.untyped_storage().data_ptr()
    dev.add_(10)  # later writes to the base are seen through the expanded view
    torch.testing.assert_close(e.cpu(), (cpu + 10).expand(3, 5))
    torch.testing.assert_close(e.sum(1).cpu(), (cpu + 10).expand(3, 5).sum(1))


def test_view_as_real_complex():
    cpu = torch.complex(torch.randn(4, 3), torch.randn(4, 3))
    dev = cpu.to("neuron")
    r = torch.view_as_real(dev)
    assert r.shape == (4, 3, 2) and r.dtype == torch.float32
    assert r.untyped_storage().data_ptr() == dev.untyped_storage().data_ptr()
    torch.testing.assert_close(r.cpu(), torch.view_as_real(cpu))
    r[..., 1].zero_()  # kill the imaginary part through the real view
    torch.testing.assert_close(dev.cpu(), torch.complex(cpu.real, torch.zeros(4, 3)))
    torch.testing.assert_close(torch.view_as_complex(r).cpu(), dev.cpu())


def test_setitem_through_chained_views():
    cpu, dev = base_pair(6, 6)
    cpu.t()[1:4].diagonal().fill_(-1)
    dev.t()[1:4].diagonal().fill_(-1)
    cpu[::2, 1::3] = 7
    dev[::2, 1::3] = 7
    torch.testing.assert_close(dev.cpu(), cpu)


def test_inplace_on_base_seen_by_view_queued_behind_work():
    cpu, dev = base_pair(8, 8)
    v = dev[2:5].t()
    keep = busy()  # the in-place op below waits in the queue
    dev.add_(1000)
    assert neuron_eager.pending_work() > 0
    torch.testing.assert_close(v.cpu(), (cpu + 1000)[2:5].t())
    del keep


# ---- copies between devices -----------------------------------------------------

def test_round_trip_cpu_n0_n1_cpu():
    cpu = torch.randn(17, 33)
    a = cpu.to(N0)
    b = a.to(N1)
    assert a.device == N0 and b.device == N1
    assert b.untyped_storage().data_ptr() != a.untyped_storage().data_ptr()
    back = b.to(N0)
    assert back.device == N0
    torch.testing.assert_close(back.cpu(), cpu, rtol=0, atol=0)
    torch.testing.assert_close(b.cpu(), cpu, rtol=0, atol=0)
    # the copies are independent
    b.zero_()
    torch.testing.assert_close(a.cpu(), cpu, rtol=0, atol=0)
    assert b.abs().sum().item() == 0


def test_cross_core_copy_waits_for_producer():
    a = torch.randn(1500, 1500, device=N0)
    prod = a @ a  # still queued on core 0 when the copy is issued
    on1 = prod.to(N1)
    expect = a.cpu() @ a.cpu()
    torch.testing.assert_close(on1.cpu(), expect, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close((on1 * 2).to(N0).cpu(), expect * 2, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("src_dev,dst_dev", [("cpu", "neuron:0"), ("neuron:0", "cpu"),
                                             ("neuron:0", "neuron:1"), ("neuron:0", "neuron:0")])
def test_noncontiguous_copy_(src_dev, dst_dev):
    ref_src = torch.randn(5, 7, 3)
    src = ref_src.to(src_dev).permute(2, 0, 1)[:, ::2]
    assert not src.is_contiguous()
    dst = torch.full((7, 4, 6), -5.0, device=dst_dev).permute(2, 1, 0)[1:4, 1:4]
    assert not dst.is_contiguous() and dst.shape == src.shape
    dst.copy_(src)
    ref_dst = torch.full((7, 4, 6), -5.0).permute(2, 1, 0)[1:4, 1:4]
    ref_dst.copy_(ref_src.permute(2, 0, 1)[:, ::2])
    torch.testing.assert_close(dst.cpu(), ref_dst, rtol=0, atol=0)
    # the untouched elements of dst's base kept their value
    torch.testing.assert_close(dst._base.cpu(), ref_dst._base, rtol=0, atol=0)


def test_noncontiguous_to_and_contiguous():
    cpu = torch.randn(6, 10)
    dev = cpu.to("neuron")
    t = dev.t()
    c = t.contiguous()
    assert c.is_contiguous() and c.data_ptr() != t.data_ptr()
    torch.testing.assert_close(c.cpu(), cpu.t().contiguous(), rtol=0, atol=0)
    torch.testing.assert_close(t.cpu(), cpu.t(), rtol=0, atol=0)
    torch.testing.assert_close(cpu.t().to("neuron").cpu(), cpu.t(), rtol=0, atol=0)


# ---- dtype conversions ----------------------------------------------------------

SRC = torch.tensor([-3.7, -1.0, -0.4, 0.0, 0.5, 1.0, 2.5, 65504.0, 1e-3, 123.456])
CONV = [torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64, torch.bool]


@pytest.mark.parametrize("dtype", CONV, ids=str)
def test_float32_to_dtype_matches_cpu(dtype):
    dev = SRC.to("neuron")
    out = dev.to(dtype)
    assert out.dtype == dtype and out.device.type == "neuron"
    torch.testing.assert_close(out.cpu(), SRC.to(dtype), rtol=0, atol=0)
    # combined device + dtype move, both directions
    torch.testing.assert_close(SRC.to("neuron", dtype).cpu(), SRC.to(dtype), rtol=0, atol=0)
    torch.testing.assert_close(dev.to("cpu", dtype), SRC.to(dtype), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", CONV, ids=str)
def test_dtype_to_float32_matches_cpu(dtype):
    src = SRC.to(dtype)
    out = src.to("neuron").to(torch.float32)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.cpu(), src.to(torch.float32), rtol=0, atol=0)
    torch.testing.assert_close(out.cpu(), src.float(), rtol=0, atol=0)


def test_copy_into_other_dtype_noncontiguous():
    dst = torch.zeros(4, 6, dtype=torch.float16, device="neuron")
    src = torch.randn(6, 4, dtype=torch.float64)
    dst.copy_(src.t())
    torch.testing.assert_close(dst.cpu(), src.t().half(), rtol=0, atol=0)
    dst[1].copy_(torch.arange(6, device="neuron", dtype=torch.int64))
    assert dst[1].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


# ---- .to(copy=True) and snapshot semantics -------------------------------------

def test_to_copy_true():
    dev = torch.randn(5, device="neuron")
    same = dev.to("neuron")
    assert same is dev
    cp = dev.to("neuron", copy=True)
    assert cp is not dev and cp.data_ptr() != dev.data_ptr()
    torch.testing.assert_close(cp.cpu(), dev.cpu(), rtol=0, atol=0)
    old = dev.cpu()
    dev.add_(1)
    torch.testing.assert_close(cp.cpu(), old, rtol=0, atol=0)
    cpu = torch.randn(5)
    assert cpu.to("cpu") is cpu and cpu.to("cpu", copy=True) is not cpu


def test_host_to_device_copy_snapshots_source():
    keep = busy(4)  # the queue is busy for a while
    src = torch.arange(100000, dtype=torch.float32)
    expect = src.clone()
    dev = src.to("neuron")
    assert neuron_eager.pending_work() > 0, "the copy should have been queued"
    src.fill_(-1.0)  # modify the host source before the queued copy could run
    src.resize_(0)   # and drop its memory
    torch.testing.assert_close(dev.cpu(), expect, rtol=0, atol=0)
    del keep


def test_copy_from_host_into_view_snapshots_source():
    keep = busy(3)
    dst = torch.zeros(10, 10, device="neuron")
    src = torch.ones(10)
    dst[3].copy_(src)
    src.mul_(9)
    expect = torch.zeros(10, 10)
    expect[3] = 1
    torch.testing.assert_close(dst.cpu(), expect, rtol=0, atol=0)
    del keep
