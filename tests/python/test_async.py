"""Asynchronous execution: ops return before they run; syncs, errors, streams, events."""

import subprocess
import sys
import textwrap

import pytest
import torch  # autoloads neuron_eager

import neuron_eager

SIZE = 1500


def big_work(n=4, device="neuron"):
    a = torch.randn(SIZE, SIZE, device=device)
    return a, [a @ a for _ in range(n)]


def run_py(code, **env):
    import os
    full = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(autouse=True)
def drained():
    torch.neuron.synchronize()
    yield
    torch.neuron.synchronize()


def test_ops_return_before_they_run():
    a, outs = big_work(4)
    assert neuron_eager.pending_work() > 0, "matmuls ran synchronously"
    assert outs[-1].shape == (SIZE, SIZE) and outs[-1].device.type == "neuron"
    torch.neuron.synchronize()
    assert neuron_eager.pending_work() == 0
    c = neuron_eager.counters()
    assert c["ops_queued"] > 0


def test_synchronize_waits_per_core():
    _, outs0 = big_work(3, "neuron:0")
    _, outs1 = big_work(3, "neuron:1")
    assert neuron_eager.pending_work(0) > 0 and neuron_eager.pending_work(1) > 0
    torch.neuron.synchronize(1)
    assert neuron_eager.pending_work(1) == 0
    torch.neuron.synchronize("neuron:0")
    assert neuron_eager.pending_work(0) == 0


def test_host_reads_see_queued_results():
    a, _ = big_work(3)  # keeps the queue busy
    x = torch.arange(12, dtype=torch.float32, device="neuron").reshape(3, 4)
    y = x * 2 + 1
    ref = torch.arange(12, dtype=torch.float32).reshape(3, 4) * 2 + 1
    assert y.sum().item() == ref.sum().item()
    assert y.tolist() == ref.tolist()
    torch.testing.assert_close(y.cpu(), ref, rtol=0, atol=0)
    assert "device='neuron:0'" in str(y) and "23." in str(y)
    assert repr(y).count("23.") == 1
    big_work(2)
    assert bool(y[2, 3] > 22) is True
    assert bool((y > 1000).any()) is False
    assert int(y.argmax()) == 11 and float(y.max()) == 23.0


def test_print_waits(capsys):
    big_work(2)
    z = torch.full((2,), 7.5, device="neuron")
    print(z)
    assert "7.5000" in capsys.readouterr().out


def test_results_of_chain_match_cpu():
    a, outs = big_work(2)
    cpu_a = a.cpu()
    ref = cpu_a @ cpu_a
    torch.testing.assert_close(outs[0].cpu(), ref, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(outs[1].cpu(), ref, rtol=1e-4, atol=1e-3)


ERRORS = {
    "index_select": (lambda w, i: torch.index_select(w, 0, i), ("index_select",)),
    # embedding is composite: it runs index_select on the worker
    "embedding": (lambda w, i: torch.nn.functional.embedding(i, w), ("embedding", "index_select")),
}


@pytest.mark.parametrize("name", list(ERRORS))
def test_worker_error_surfaces_at_sync(name):
    fn, names = ERRORS[name]
    w = torch.randn(10, 4, device="neuron")
    idx = torch.tensor([1, 99], device="neuron")
    big_work(2)
    out = fn(w, idx)  # must not raise: the bad index is only seen by the worker
    assert out.shape == (2, 4)
    with pytest.raises(RuntimeError) as info:
        torch.neuron.synchronize()
    msg = str(info.value)
    assert any(n in msg for n in names), msg
    assert "out of range" in msg
    # the error is reported once and the device stays usable
    torch.neuron.synchronize()
    good = fn(w, torch.tensor([3, 0], device="neuron"))
    torch.testing.assert_close(good.cpu(), w.cpu()[[3, 0]])
    assert neuron_eager.pending_work() == 0


def test_worker_error_surfaces_at_item():
    w = torch.randn(10, device="neuron")
    bad = torch.index_select(w, 0, torch.tensor([42], device="neuron"))
    with pytest.raises(RuntimeError, match="index_select"):
        bad.sum().item()
    assert torch.ones(3, device="neuron").sum().item() == 3.0


def test_launch_blocking_subprocess():
    r = run_py("""
        import torch, neuron_eager
        assert neuron_eager.launch_blocking()
        a = torch.randn(1500, 1500, device="neuron")
        for _ in range(3):
            b = a @ a
            assert neuron_eager.pending_work() == 0, neuron_eager.pending_work()
        w = torch.randn(10, 4, device="neuron")
        try:
            torch.index_select(w, 0, torch.tensor([0, 77], device="neuron"))
        except RuntimeError as e:
            assert "index_select" in str(e), str(e)
            print("RAISED_AT_CALL")
        torch.neuron.synchronize()
        print("SYNC_OK", (torch.ones(4, device="neuron") * 2).sum().item())
    """, NEURON_LAUNCH_BLOCKING="1")
    assert r.returncode == 0, r.stderr
    assert "RAISED_AT_CALL" in r.stdout, r.stdout + r.stderr
    assert "SYNC_OK 8.0" in r.stdout


def test_set_launch_blocking_runtime_toggle():
    assert neuron_eager.launch_blocking() is False
    neuron_eager.set_launch_blocking(True)
    try:
        big_work(2)
        assert neuron_eager.pending_work() == 0
    finally:
        neuron_eager.set_launch_blocking(False)
    big_work(3)
    assert neuron_eager.pending_work() > 0


# ---- streams and events ---------------------------------------------------------

def test_stream_context_and_ordering():
    default = torch.neuron.current_stream()
    s = torch.neuron.Stream()
    assert s.device.type == "neuron" and s != default and s.stream_id != default.stream_id
    a = torch.randn(SIZE, SIZE, device="neuron")
    s.wait_stream(default)  # as on CUDA, streams do not order against each other by themselves
    with torch.neuron.stream(s):
        assert torch.neuron.current_stream() == s
        b = a @ a
        done = torch.neuron.Event()
        done.record(s)
    assert torch.neuron.current_stream() == default
    default.wait_event(done)
    c = b + 1  # queued on the default stream after b on s
    torch.testing.assert_close(c.cpu(), a.cpu() @ a.cpu() + 1, rtol=1e-4, atol=1e-3)
    s.synchronize()
    assert s.query()


def test_memory_freed_under_queued_work_waits_for_it_before_reuse():
    # Queued ops hold device memory by address, not by reference (the program's use
    # counts stay as on CPU). A tensor freed while the default stream still has to read
    # it keeps its block until that work ran, even if an idle stream asks for a block of
    # the same size meanwhile.
    a = torch.randn(SIZE, SIZE)
    x = a.to("neuron")
    torch.neuron.synchronize()
    keep = big_work(3)  # the default stream stays busy for a while
    y = x @ x
    allocated = torch.neuron.memory_allocated()
    del x
    assert torch.neuron.memory_allocated() < allocated  # no longer a tensor's memory
    s = torch.neuron.Stream()
    with torch.neuron.stream(s):
        z = torch.full((SIZE, SIZE), 7.0, device="neuron")
    s.synchronize()
    assert neuron_eager.pending_work() > 0  # the test raced as intended
    torch.testing.assert_close(y.cpu(), a @ a, rtol=1e-4, atol=1e-3)
    assert bool((z.cpu() == 7).all())
    del keep


def test_a_host_far_ahead_waits_for_the_queue():
    # Backpressure: the dispatching thread waits once 1024 ops are queued on the stream,
    # so memory held for queued work stays bounded in loops without syncs.
    keep = big_work(2)  # the worker is busy for a while
    x = torch.zeros(64, 64, device="neuron")
    peak = 0
    for _ in range(3000):
        x = x + 1
        peak = max(peak, neuron_eager.pending_work())
    assert 1000 <= peak <= 1025
    assert bool((x.cpu() == 3000).all())
    del keep


def test_host_threads_sharing_a_stream_never_miss_a_wake_up():
    # Four host threads queue ops on one stream and wait for them at different points,
    # while the worker takes the queue a batch at a time and takes the lock to wake
    # waiters only when one is counted. Each round queues a product long enough that
    # the waits block past their first timed phase: a lost wake-up then hangs a thread
    # (the join's timeout fails the test). Every thread's result is CPU eager's, and the
    # ops of each thread run in its order (a running sum through in-place adds).
    r = run_py("""
        import threading, torch
        torch.manual_seed(0)
        big = torch.randn(1000, 1000)
        big_d = big.to("neuron")
        errors = []
        def work(k):
            try:
                x = torch.zeros(16, device="neuron")
                ref = torch.zeros(16)
                for i in range(600):
                    x.add_(k + i % 7)
                    ref.add_(k + i % 7)
                    if i % 150 == 149:
                        s = (big_d @ big_d).sum()
                        torch.neuron.synchronize()
                        assert torch.equal(x.cpu(), ref), (k, i)
                assert torch.equal(x.cpu(), ref), k
            except Exception as e:  # reported by the main thread
                errors.append(repr(e))
        threads = [threading.Thread(target=work, args=(k,), daemon=True) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads), "a host thread never woke"
        assert not errors, errors
        print("OK")
    """, NEURON_SYNC_YIELD_US="0")  # waits block at once (no yielding first)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "OK" in r.stdout


def test_device_busy_time_counts_the_workers_running_items():
    import time
    neuron_eager.reset_counters()
    assert neuron_eager.counters()["device_busy_ns"] == 0  # an idle device, just reset
    start = time.perf_counter()
    a, ys = big_work(3)
    queued = time.perf_counter()
    torch.neuron.synchronize()
    wall_ns = (time.perf_counter() - start) * 1e9
    busy = neuron_eager.counters()["device_busy_ns"]
    # The products ran on the worker, mostly after the host had queued them: the busy
    # time is most of the wall time after queueing, and never more than all of it (one
    # stream, one worker).
    assert 0.5 * (wall_ns - (queued - start) * 1e9) < busy <= wall_ns
    del a, ys


def test_stream_wait_stream():
    s = torch.neuron.Stream()
    a = torch.randn(SIZE, SIZE, device="neuron")
    b = a @ a
    s.wait_stream(torch.neuron.current_stream())
    with torch.neuron.stream(s):
        c = b.sum(0)
    s.synchronize()
    torch.testing.assert_close(c.cpu(), (a.cpu() @ a.cpu()).sum(0), rtol=1e-3, atol=1e-1)


def test_event_query_synchronize_elapsed():
    start = torch.neuron.Event(enable_timing=True)
    end = torch.neuron.Event(enable_timing=True)
    start.record()
    big_work(4)
    end.record()
    assert end.query() is False, "the event completed before the queued matmuls"
    end.synchronize()
    assert end.query() is True and start.query() is True
    ms = start.elapsed_time(end)
    assert isinstance(ms, float) and ms > 0.0
    # a recorded event with nothing queued before it completes without waiting
    e = torch.neuron.Event()
    torch.neuron.synchronize()
    e.record()
    e.synchronize()
    assert e.query()


def test_elapsed_time_needs_timing():
    a, b = torch.neuron.Event(), torch.neuron.Event()
    a.record()
    b.record()
    b.synchronize()
    with pytest.raises((RuntimeError, ValueError), match="enable_timing"):
        a.elapsed_time(b)


def test_event_wait_across_streams():
    s1, s2 = torch.neuron.Stream(), torch.neuron.Stream()
    x = torch.zeros(SIZE, SIZE, device="neuron")
    s1.wait_stream(torch.neuron.current_stream())
    with torch.neuron.stream(s1):
        a = torch.randn(SIZE, SIZE, device="neuron")
        for _ in range(3):
            x.add_(a @ a)
        ev = torch.neuron.Event()
        ev.record()
    with torch.neuron.stream(s2):
        ev.wait()
        y = x.clone()
    s2.synchronize()
    ref = 3 * (a.cpu() @ a.cpu())
    torch.testing.assert_close(y.cpu(), ref, rtol=1e-3, atol=1e-2)
