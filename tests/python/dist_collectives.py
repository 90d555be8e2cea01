"""Every collective on `neuron` against the same collective on CPU tensors with Gloo.

Run under torchrun with 2 processes (tests/python/test_distributed.py). One process group
"cpu:gloo,neuron:neuron" carries both: CPU tensors go to Gloo, neuron tensors to the
"neuron" backend. Each check issues the collective on CPU copies of the inputs and on
neuron copies and requires bit-equal results. Prints one "OK <name>" line per check;
any mismatch raises (the process exits non-zero).
"""

import datetime
import os

import torch
import torch.distributed as dist

DEV = "neuron"


def say(line):
    """One write per line: the ranks share torchrun's stdout, and print() may split a line
    into two writes that another rank's output lands between."""
    os.write(1, (line + "\n").encode())

CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def rank_data(shape, dtype=torch.float32, salt=0):
    g = torch.Generator().manual_seed(1000 * dist.get_rank() + salt)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(-50, 50, shape, generator=g, dtype=dtype)


def same(name, cpu, dev):
    cpu = list(cpu) if isinstance(cpu, (list, tuple)) else [cpu]
    dev = list(dev) if isinstance(dev, (list, tuple)) else [dev]
    assert len(cpu) == len(dev), f"{name}: {len(cpu)} CPU results, {len(dev)} neuron results"
    for k, (c, d) in enumerate(zip(cpu, dev)):
        d = d.cpu()
        assert c.dtype == d.dtype and c.shape == d.shape, f"{name}[{k}]: {c.dtype}{tuple(c.shape)} vs {d.dtype}{tuple(d.shape)}"
        assert torch.equal(c, d), f"{name}[{k}] differs on rank {dist.get_rank()}:\n{c}\n{d}"


def both(make):
    """make(device) -> (result tensors) issued on CPU and on neuron."""
    return make("cpu"), make(DEV)


@check
def all_reduce_ops():
    world = dist.get_world_size()
    for op_name in ("SUM", "AVG", "MAX", "MIN", "PRODUCT"):
        for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.int64):
            if op_name == "AVG" and not dtype.is_floating_point:
                continue
            x = rank_data((33, 7), dtype)
            c = x.clone()
            if op_name == "AVG":  # Gloo has no AVG: its oracle is SUM, then the same division
                dist.all_reduce(c, op=dist.ReduceOp.SUM)
                c = c.div_(world)
            else:
                dist.all_reduce(c, op=getattr(dist.ReduceOp, op_name))
            d = x.to(DEV)
            dist.all_reduce(d, op=getattr(dist.ReduceOp, op_name))
            same(f"all_reduce {op_name} {dtype}", c, d)


@check
def all_reduce_ordering():
    """The collective reads what queued ops wrote and later ops read its result, while
    the host never waits (async_op, then ops on the output)."""
    x = rank_data((256,))
    c = x * 2 + 1
    dist.all_reduce(c)
    c = c.sin() * 3
    d = x.to(DEV) * 2 + 1
    work = dist.all_reduce(d, async_op=True)
    work.wait()
    d = d.sin() * 3
    same("all_reduce ordering", c, d)
    torch.neuron.synchronize()
    assert work.is_completed(), "work not completed after a device sync"
    fut = dist.all_reduce(d, async_op=True).get_future()
    dist.all_reduce(c)
    same("all_reduce future", [c], fut.wait())


@check
def host_does_not_block():
    """A collective returns before the peer has even issued it (async_op and blocking
    calls alike): rank 1 issues only once rank 0 saw both of its calls return incomplete."""
    store = dist.distributed_c10d._get_default_store()
    rank = dist.get_rank()
    a, b = torch.ones(64, device=DEV), torch.ones(64, device=DEV)
    if rank == 0:
        work = dist.all_reduce(a, async_op=True)
        dist.all_reduce(b)  # blocking call: orders the stream, not the host
        pending = not work.is_completed() and torch.neuron.current_stream().query() is False
        store.set("host_does_not_block", "1")
        assert pending, "a collective completed before its peer issued it"
    else:
        store.wait(["host_does_not_block"])
        dist.all_reduce(a)
        dist.all_reduce(b)
    assert a.cpu().tolist() == [2.0] * 64 and b.cpu().tolist() == [2.0] * 64


@check
def broadcast_and_reduce():
    for src in range(dist.get_world_size()):
        x = rank_data((5, 9), salt=src)
        c, d = x.clone(), x.to(DEV)
        dist.broadcast(c, src=src)
        dist.broadcast(d, src=src)
        same(f"broadcast src={src}", c, d)
        c, d = x.clone(), x.to(DEV)
        dist.reduce(c, dst=src, op=dist.ReduceOp.MAX)
        dist.reduce(d, dst=src, op=dist.ReduceOp.MAX)
        same(f"reduce dst={src}", c, d)


@check
def all_gather_forms():
    world = dist.get_world_size()
    x = rank_data((6, 4))
    c = [torch.empty_like(x) for _ in range(world)]
    d = [torch.empty_like(x, device=DEV) for _ in range(world)]
    dist.all_gather(c, x)
    dist.all_gather(d, x.to(DEV))
    same("all_gather", c, d)
    c = torch.empty(world * 6, 4)
    d = torch.empty(world * 6, 4, device=DEV)
    dist.all_gather_into_tensor(c, x)
    dist.all_gather_into_tensor(d, x.to(DEV))
    same("all_gather_into_tensor", c, d)


@check
def reduce_scatter_forms():
    world = dist.get_world_size()
    x = rank_data((world * 8, 3))
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX):
        c = torch.empty(8, 3)
        d = torch.empty(8, 3, device=DEV)
        dist.reduce_scatter_tensor(c, x, op=op)
        dist.reduce_scatter_tensor(d, x.to(DEV), op=op)
        same(f"reduce_scatter_tensor {op}", c, d)
        chunks = list(x.chunk(world))
        c = torch.empty(8, 3)
        d = torch.empty(8, 3, device=DEV)
        dist.reduce_scatter(c, chunks, op=op)
        dist.reduce_scatter(d, [t.to(DEV) for t in chunks], op=op)
        same(f"reduce_scatter {op}", c, d)
    c = torch.empty(8, 3)
    dist.reduce_scatter_tensor(c, x)
    c /= world
    d = torch.empty(8, 3, device=DEV)
    dist.reduce_scatter_tensor(d, x.to(DEV), op=dist.ReduceOp.AVG)
    same("reduce_scatter_tensor AVG", c, d)


@check
def all_to_all_forms():
    world, rank = dist.get_world_size(), dist.get_rank()
    # Uneven splits: rank r sends r + k + 1 rows to rank k.
    in_splits = [rank + k + 1 for k in range(world)]
    out_splits = [k + rank + 1 for k in range(world)]
    x = rank_data((sum(in_splits), 3))
    c = torch.empty(sum(out_splits), 3)
    d = torch.empty(sum(out_splits), 3, device=DEV)
    dist.all_to_all_single(c, x, out_splits, in_splits)
    dist.all_to_all_single(d, x.to(DEV), out_splits, in_splits)
    same("all_to_all_single uneven", c, d)
    c = torch.empty(world * 2, 5)
    d = torch.empty(world * 2, 5, device=DEV)
    even = rank_data((world * 2, 5), salt=1)
    dist.all_to_all_single(c, even)
    dist.all_to_all_single(d, even.to(DEV))
    same("all_to_all_single", c, d)
    ins = [rank_data((3, 2), salt=10 + k) for k in range(world)]
    c = [torch.empty(3, 2) for _ in range(world)]
    d = [torch.empty(3, 2, device=DEV) for _ in range(world)]
    dist.all_to_all(c, ins)
    dist.all_to_all(d, [t.to(DEV) for t in ins])
    same("all_to_all", c, d)


@check
def gather_scatter():
    world, rank = dist.get_world_size(), dist.get_rank()
    x = rank_data((4,))
    root = world - 1
    c = [torch.empty(4) for _ in range(world)] if rank == root else None
    d = [torch.empty(4, device=DEV) for _ in range(world)] if rank == root else None
    dist.gather(x, c, dst=root)
    dist.gather(x.to(DEV), d, dst=root)
    if rank == root:
        same("gather", c, d)
    parts = [rank_data((3,), salt=20 + k) for k in range(world)]
    c, d = torch.empty(3), torch.empty(3, device=DEV)
    dist.scatter(c, parts if rank == 0 else None, src=0)
    dist.scatter(d, [p.to(DEV) for p in parts] if rank == 0 else None, src=0)
    same("scatter", c, d)


@check
def point_to_point():
    world, rank = dist.get_world_size(), dist.get_rank()
    peer = (rank + 1) % world
    prev = (rank - 1) % world
    x = rank_data((10,))
    # Blocking send/recv, lower rank first.
    if rank == 0:
        dist.send(x.to(DEV), peer)
        r = torch.empty(10, device=DEV)
        dist.recv(r, prev)
    else:
        r = torch.empty(10, device=DEV)
        dist.recv(r, prev)
        dist.send(x.to(DEV), peer)
    expect = torch.empty(10)
    reqs = [dist.isend(x, peer), dist.irecv(expect, prev)]
    for q in reqs:
        q.wait()
    same("send/recv", expect, r)
    # Both ranks send first: only non-blocking starts make this work.
    r2 = torch.empty(10, device=DEV)
    reqs = [dist.isend(x.to(DEV) * 2, peer), dist.irecv(r2, prev)]
    for q in reqs:
        q.wait()
    same("isend/irecv", expect * 2, r2)
    r3 = torch.empty(10, device=DEV)
    ops = [dist.P2POp(dist.isend, x.to(DEV) * 3, peer), dist.P2POp(dist.irecv, r3, prev)]
    for q in dist.batch_isend_irecv(ops):
        q.wait()
    same("batch_isend_irecv", expect * 3, r3)


@check
def coalesced():
    xs = [rank_data((n,), salt=n) for n in (3, 17, 64)]
    cs = [x.clone() for x in xs]
    ds = [x.to(DEV) for x in xs]
    with dist._coalescing_manager(device=torch.device(DEV)):
        for d in ds:
            dist.all_reduce(d)
    for c in cs:
        dist.all_reduce(c)
    same("coalesced all_reduce", cs, ds)
    world = dist.get_world_size()
    c_out = [torch.empty(world * x.numel()) for x in xs]
    d_out = [torch.empty(world * x.numel(), device=DEV) for x in xs]
    with dist._coalescing_manager(device=torch.device(DEV)):
        for o, x in zip(d_out, xs):
            dist.all_gather_into_tensor(o, x.to(DEV))
    for o, x in zip(c_out, xs):
        dist.all_gather_into_tensor(o, x)
    same("coalesced all_gather_into_tensor", c_out, d_out)


@check
def sub_groups():
    world = dist.get_world_size()
    group = dist.new_group(list(range(world)))
    x = rank_data((7,))
    c, d = x.clone(), x.to(DEV)
    dist.all_reduce(c, group=group)
    dist.all_reduce(d, group=group)
    same("new_group all_reduce", c, d)
    solo = dist.new_group([world - 1])
    if dist.get_rank() == world - 1:
        d = x.to(DEV)
        dist.all_reduce(d, group=solo)
        same("single-rank group", x, d)
    dist.barrier()


@check
def traced():
    """Collectives appear in the trace on their own track with call, bytes and group, the
    summary lists them, and the op stream is cut before each (a barrier cut)."""
    import tempfile

    import neuron_eager.trace as nt
    from neuron_eager.trace.format import COLLECTIVE
    from neuron_eager.trace.text import format_summary
    from neuron_eager.trace.tracks import build_tracks

    path = os.path.join(tempfile.mkdtemp(), f"rank{dist.get_rank()}.ntrace")
    x = torch.ones(1024, device=DEV)
    with nt.record(path):
        y = x * 2
        dist.all_reduce(y)
        z = torch.empty(2048, device=DEV)
        dist.all_gather_into_tensor(z, y + 1)
        z.sum().item()
    t = nt.load(path)
    ev = t.events[t.events["kind"] == COLLECTIVE]
    calls = [(t.string(int(e["value"])), int(e["aux"])) for e in ev]
    assert calls == [("allreduce", 4096), ("allgather_into_tensor", 4096)], calls
    assert all(t.string(int(e["reserved"])) for e in ev), "collective events name no group"
    assert any(tr.name == "collectives" and len(tr) == 2 for tr in build_tracks(t))
    s = nt.summarize(t)
    assert [(c.call, c.count) for c in s.collectives] and {c.call for c in s.collectives} == {
        "allreduce", "allgather_into_tensor"}, s.collectives
    assert "Collectives" in format_summary(s)
    from neuron_eager.trace import html, perfetto

    slices = [e for e in perfetto.chrome_trace(t)["traceEvents"] if e.get("cat") == "collective"]
    assert [e["args"]["bytes"] for e in slices] == [4096, 4096], slices
    html.render(t)
    cuts = [int(f) for f in t.events["flags"][t.events["kind"] == 4]]  # SegmentCut reasons
    assert 2 in cuts, f"no barrier cut: {cuts}"


def main():
    dist.init_process_group("cpu:gloo,neuron:neuron", timeout=datetime.timedelta(seconds=60))
    torch.neuron.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.neuron.device_count())
    assert dist.get_backend(None) is not None
    for fn in CHECKS:
        fn()
        torch.neuron.synchronize()
        if dist.get_rank() == 0:
            say(f"OK {fn.__name__}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
