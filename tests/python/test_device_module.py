"""Registration, torch.neuron device module, RNG, autocast, serialization, config."""

import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch  # autoloads neuron_eager

import neuron_eager


def run_py(code, **env):
    full = dict(os.environ)
    for k in ("NEURON_CORES", "NEURON_HBM_BYTES", "NEURON_EAGER_MODE", "NEURON_LAUNCH_BLOCKING",
              "TORCH_DEVICE_BACKEND_AUTOLOAD"):
        full.pop(k, None)
    full.update(env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full,
                          capture_output=True, text=True, timeout=300, cwd="/")


# ---- registration ---------------------------------------------------------------

def test_autoload_registers_backend():
    r = run_py("""
        import torch
        assert hasattr(torch, "neuron") and torch.neuron.is_available()
        d = torch.device("neuron")
        assert d.type == "neuron"
        t = torch.ones(3).neuron()
        assert t.is_neuron and t.device == torch.device("neuron:0")
        assert not torch.ones(1).is_neuron
        assert torch._C._get_privateuse1_backend_name() == "neuron"
        print("SUM", (t * 2).sum().item())
    """)
    assert r.returncode == 0, r.stderr
    assert "SUM 6.0" in r.stdout


def test_import_package_before_torch():
    # `import neuron_eager` as the first import must work as well as `import torch`
    r = run_py("import neuron_eager, torch; print(torch.ones(2, device='neuron').sum().item())")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "2.0" in r.stdout


def test_autoload_disabled():
    r = run_py("""
        import torch
        print("HAS", hasattr(torch, "neuron"))
        try:
            torch.empty(1, device="neuron")
        except RuntimeError as e:
            print("NODEV")
    """, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert r.returncode == 0, r.stderr
    assert "HAS False" in r.stdout and "NODEV" in r.stdout


def test_device_count_follows_env():
    r = run_py("""
        import torch
        print("N", torch.neuron.device_count(), torch.accelerator.device_count())
        print("D", torch.empty(1, device="neuron:2").device)
        try:
            torch.empty(1, device="neuron:3")
        except (RuntimeError, ValueError) as e:
            print("BAD3")
    """, NEURON_CORES="3")
    assert r.returncode == 0, r.stderr
    assert "N 3 3" in r.stdout and "D neuron:2" in r.stdout and "BAD3" in r.stdout


@pytest.mark.parametrize("yield_us", ["0", "1", "1000000"])
def test_host_waits_sleep_or_yield_with_the_same_results(yield_us):
    # 0: a waiting host sleeps at once; 1: it yields 1 us, then sleeps (the worker must
    # wake it); 1000000: it yields until the work is done. Each wait ends with every
    # result there, equal to CPU's.
    r = run_py("""
        import torch, threading
        torch.manual_seed(0)
        x = torch.randn(256, 256)
        d = x.to("neuron")
        for step in range(20):
            y = d
            for _ in range(5):
                y = (y @ d).tanh()
            c = x
            for _ in range(5):
                c = (c @ x).tanh()
            assert torch.equal(y.cpu(), c), step
            torch.neuron.synchronize()
        # A second host thread waiting at the same time as the main one.
        out = {}
        t = threading.Thread(target=lambda: out.setdefault("v", (d @ d).sum().item()))
        t.start()
        main = (d @ d).sum().item()
        t.join()
        assert out["v"] == main == (x @ x).sum().item()
        print("OK")
    """, NEURON_SYNC_YIELD_US=yield_us)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "OK" in r.stdout


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning needs 2 allowed CPUs")
@pytest.mark.parametrize("pin", ["0", "1"])
def test_worker_team_threads_pinned_to_distinct_cpus(pin):
    # While the host waits, the worker's OpenMP team (2 threads: CPU eager's count here)
    # has each thread on its own CPU; the host threads stay free. NEURON_PIN_WORKERS=0
    # places nothing. The wait is long (tens of ms), so the spin ballast's thread
    # (worker_threads.cpp) exists too; it must not inherit a placed worker's single CPU.
    r = run_py("""
        import os, torch
        torch.set_num_threads(2)
        x = torch.randn(512, 512).to("neuron")
        ys = [x @ x for _ in range(30)]  # 2-thread kernels, most of them run while
        torch.neuron.synchronize()       # the host waits here
        masks = [os.sched_getaffinity(int(t)) for t in os.listdir("/proc/self/task")]
        single = sorted(next(iter(m)) for m in masks if len(m) == 1)
        print("SINGLE", single, "MAIN", len(os.sched_getaffinity(0)))
    """, NEURON_PIN_WORKERS=pin)
    assert r.returncode == 0, r.stderr[-2000:]
    line = next(l for l in r.stdout.splitlines() if l.startswith("SINGLE"))
    single = eval(line.split("SINGLE", 1)[1].split("MAIN")[0])
    assert int(line.rsplit("MAIN", 1)[1]) >= 2  # the host thread is not pinned
    if pin == "1":
        assert len(single) == 2 and single[0] != single[1], line
    else:
        assert single == [], line


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning needs 2 allowed CPUs")
def test_tiny_items_do_not_place_the_worker_team():
    # Greedy decoding of a tiny transformer, a host read every step: its small products
    # are fixed to CPU eager's thread count (too small for a thread trial) but ATen runs
    # them on one thread. Placing the team for each one while the host waited put it on
    # its own CPUs 87 times in 200 steps (two system calls each way); 4 now. 512x512
    # products still place it (test_worker_team_threads_pinned_to_distinct_cpus).
    r = run_py("""
        import sys, torch, neuron_eager
        sys.path.insert(0, %r)
        from robust_workloads import make_workload
        step, read, _ = make_workload("decode", 1, "neuron")
        neuron_eager.reset_counters()
        for i in range(200):
            step(i)
            read()
        print("PLACED", neuron_eager.counters()["team_placements"])
        x = torch.randn(512, 512).to("neuron")
        ys = [x @ x for _ in range(30)]
        torch.neuron.synchronize()
        print("PLACED", neuron_eager.counters()["team_placements"])
    """ % str(Path(__file__).resolve().parents[2] / "bench" / "python"), NEURON_PIN_WORKERS="1",
               NEURON_EAGER_MODE="eager")
    assert r.returncode == 0, r.stderr[-2000:]
    decode, after_mm = [int(l.split()[1]) for l in r.stdout.splitlines() if l.startswith("PLACED")]
    assert decode <= 20, r.stdout
    assert after_mm > decode, r.stdout


@pytest.mark.parametrize("var,value,allowed", [
    ("NEURON_EAGER_MODE", "fast", "eager, adaptive"),
    ("NEURON_CORES", "0", "1 to 64"),
    ("NEURON_CORES", "65", "1 to 64"),
    ("NEURON_CORES", "two", "1 to 64"),
    ("NEURON_HBM_BYTES", "12Q", "K, M, G or T"),
    ("NEURON_HBM_BYTES", "1K", "1MiB to 1TiB"),
    ("NEURON_LAUNCH_BLOCKING", "yes", "0 or 1"),
    ("NEURON_CXX", "g++ -O3", "without spaces"),
    ("NEURON_CACHE_DIR", "", "a folder path"),
    ("NEURON_SYNC_YIELD_US", "-1", "0 to 1000000"),
    ("NEURON_PIN_WORKERS", "yes", "0 or 1"),
    ("NEURON_SYNC_YIELD_US", "5ms", "0 to 1000000"),
])
def test_bad_env_value_fails_import(var, value, allowed):
    r = run_py("import torch", **{var: value})
    assert r.returncode != 0
    assert f"{var}='{value}'" in r.stderr, r.stderr[-2000:]
    assert allowed in r.stderr, r.stderr[-2000:]


def test_mode_round_trip_and_bad_value():
    old = neuron_eager.get_mode()
    assert old in neuron_eager.MODES
    try:
        for m in ("adaptive", "eager"):
            neuron_eager.set_mode(m)
            assert neuron_eager.get_mode() == m
        with pytest.raises(ValueError) as info:
            neuron_eager.set_mode("bogus")
        assert "bogus" in str(info.value)
        assert "eager" in str(info.value) and "adaptive" in str(info.value)
        assert neuron_eager.get_mode() == "eager"  # unchanged by the failed call
    finally:
        neuron_eager.set_mode(old)


def test_mode_from_env():
    r = run_py("import torch, neuron_eager; print('M', neuron_eager.get_mode())",
               NEURON_EAGER_MODE="adaptive")
    assert r.returncode == 0, r.stderr
    assert "M adaptive" in r.stdout


# ---- current device -------------------------------------------------------------

def test_set_device_and_ctx():
    assert torch.neuron.current_device() == 0
    with torch.neuron.device(1):
        assert torch.neuron.current_device() == 1
        assert torch.empty(2, device="neuron").device == torch.device("neuron:1")
        assert torch.ones(2).neuron().device.index == 1
        with torch.neuron.device("neuron:0"):
            assert torch.zeros(1, device="neuron").device.index == 0
        assert torch.neuron.current_device() == 1
    assert torch.neuron.current_device() == 0
    torch.neuron.set_device(1)
    try:
        assert torch.randn(2, device="neuron").device.index == 1
        assert torch.neuron.current_device() == 1
    finally:
        torch.neuron.set_device(0)
    with pytest.raises((RuntimeError, ValueError, IndexError)):
        torch.neuron.set_device(7)
    assert torch.neuron.current_device() == 0


# ---- random numbers -------------------------------------------------------------

def test_manual_seed_matches_cpu():
    torch.neuron.manual_seed(1234)
    a = torch.randn(64, 8, device="neuron")
    torch.manual_seed(1234)
    ref = torch.randn(64, 8)
    torch.testing.assert_close(a.cpu(), ref, rtol=0, atol=0)
    torch.neuron.manual_seed(1234)
    b = torch.randn(64, 8, device="neuron")
    torch.testing.assert_close(b.cpu(), a.cpu(), rtol=0, atol=0)
    assert torch.neuron.initial_seed() == 1234
    c = torch.randn(64, 8, device="neuron")
    assert not torch.equal(c.cpu(), b.cpu())


def test_manual_seed_all_covers_both_cores():
    torch.neuron.manual_seed_all(7)
    a = torch.rand(100, device="neuron:0").cpu()
    b = torch.rand(100, device="neuron:1").cpu()
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_rng_state_replay():
    torch.neuron.manual_seed(99)
    torch.randn(10, device="neuron")
    state = torch.neuron.get_rng_state()
    assert state.device.type == "cpu" and state.dtype == torch.uint8
    first = torch.randn(33, device="neuron").cpu()
    torch.rand(5, device="neuron")  # advance further
    torch.neuron.set_rng_state(state)
    torch.testing.assert_close(torch.randn(33, device="neuron").cpu(), first, rtol=0, atol=0)


def test_generator_on_neuron():
    g = torch.Generator(device="neuron")
    assert g.device.type == "neuron"
    g.manual_seed(3)
    a = torch.randn(20, device="neuron", generator=g).cpu()
    ref = torch.randn(20, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(a, ref, rtol=0, atol=0)
    g.manual_seed(3)
    torch.testing.assert_close(torch.randn(20, device="neuron", generator=g).cpu(), a,
                               rtol=0, atol=0)


def test_dropout_train_matches_cpu():
    # Observed: bit-equal. The worker runs the CPU kernel with a generator in the same
    # state as CPU's default one after the same seed, so the mask matches exactly.
    x = torch.randn(50, 40)
    torch.manual_seed(11)
    ref = torch.nn.functional.dropout(x, p=0.3, training=True)
    torch.neuron.manual_seed(11)
    out = torch.nn.functional.dropout(x.to("neuron"), p=0.3, training=True).cpu()
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    zeros = (out == 0).float().mean().item()
    assert 0.2 < zeros < 0.4
    # eval mode is the identity
    m = torch.nn.Dropout(0.3).eval()
    torch.testing.assert_close(m(x.to("neuron")).cpu(), x, rtol=0, atol=0)


# ---- autocast, serialization, pinned memory -----------------------------------

def test_autocast_bf16():
    a = torch.randn(16, 16, device="neuron")
    b = torch.randn(16, 16, device="neuron")
    with torch.autocast(device_type="neuron", dtype=torch.bfloat16):
        out = a @ b
        assert torch.is_autocast_enabled("neuron")
    assert out.dtype == torch.bfloat16 and out.device.type == "neuron"
    ref = a.cpu().bfloat16() @ b.cpu().bfloat16()
    torch.testing.assert_close(out.cpu(), ref, rtol=2e-2, atol=2e-2)
    assert (a @ b).dtype == torch.float32  # off again outside the block


def test_save_load_round_trip():
    t = torch.randn(4, 5, device="neuron:1")
    buf = io.BytesIO()
    torch.save({"t": t, "view": t[1:3]}, buf)
    data = buf.getvalue()
    loaded = torch.load(io.BytesIO(data), map_location="neuron")
    assert loaded["t"].device == torch.device("neuron:0")
    torch.testing.assert_close(loaded["t"].cpu(), t.cpu(), rtol=0, atol=0)
    torch.testing.assert_close(loaded["view"].cpu(), t[1:3].cpu(), rtol=0, atol=0)
    same = torch.load(io.BytesIO(data))
    assert same["t"].device == torch.device("neuron:1")
    on_cpu = torch.load(io.BytesIO(data), map_location="cpu")
    assert on_cpu["t"].device.type == "cpu"
    torch.testing.assert_close(on_cpu["t"], t.cpu(), rtol=0, atol=0)


def test_pin_memory():
    x = torch.randn(100)
    assert not x.is_pinned()
    p = x.pin_memory()
    assert p.is_pinned() and p.device.type == "cpu"
    torch.testing.assert_close(p, x, rtol=0, atol=0)
    d = p.to("neuron", non_blocking=True)
    torch.testing.assert_close(d.cpu(), x, rtol=0, atol=0)
