"""The worker's intra-op thread count (backend::set_item_threads): items whose bits do not
depend on it run on one thread while the host is busy; everything else uses CPU eager's
count. Results must stay bit-equal to CPU eager either way."""

import os
import time

import pytest
import torch
import torch.nn.functional as F

DEV = "neuron"


def _busy_host_results(fn, inputs):
    # Dispatch everything before the first sync: the host thread stays busy while the
    # worker runs (the one-thread case for free items).
    outs = [fn(x.to(DEV)) for x in inputs]
    return [o.cpu() for o in outs]


def test_sigmoid_at_a_size_whose_split_differs_keeps_cpu_bits():
    # On this build, sigmoid over 65544 elements gives other bits on 1 thread than on 2
    # (2 threads split at 32772, not a multiple of the vector width). The item must run
    # with CPU eager's count; a free rule would make it differ.
    torch.manual_seed(0)
    inputs = [torch.randn(n) * 3 for n in (65544, 70001, 131072, 100003, 4097) for _ in range(8)]
    got = _busy_host_results(torch.sigmoid, inputs)
    for x, g in zip(inputs, got):
        assert torch.equal(g, torch.sigmoid(x)), f"sigmoid over {x.numel()} elements differs from CPU"


def test_row_ops_and_elementwise_chains_match_cpu_bits():
    torch.manual_seed(1)
    inputs = [torch.randn(r, c) for r, c in ((257, 1024), (64, 256), (1000, 333), (3, 70001)) for _ in range(4)]

    def chain(x):
        y = F.layer_norm(x, (x.shape[-1],))
        return F.gelu(y).softmax(-1) + F.log_softmax(y, dim=0) * x.sigmoid()

    got = _busy_host_results(chain, inputs)
    for x, g in zip(inputs, got):
        assert torch.equal(g, chain(x)), f"chain over {tuple(x.shape)} differs from CPU"


def test_loss_backward_ops_on_one_thread_match_cpu_bits():
    # nll_loss_backward and (log_)softmax backward over the last dim run on one thread
    # while the host is busy (each sample, each row, on one thread in ATen too); other
    # dims keep CPU eager's count. Gradients must equal CPU eager's bit for bit.
    torch.manual_seed(2)
    shapes = ((64, 10), (1000, 333), (257, 1024), (4, 7, 50))
    cases = [(torch.randn(s) * 4, torch.randint(0, s[1], (s[0],) + s[2:])) for s in shapes for _ in range(3)]

    def grads(x, y, dev):
        x = x.to(dev).requires_grad_()
        loss = F.cross_entropy(x, y.to(dev), reduction="mean") + F.softmax(x, -1).pow(2).sum() \
            + F.log_softmax(x, 0).mean() + F.nll_loss(F.log_softmax(x, 1), y.to(dev), reduction="sum")
        loss.backward()
        return x.grad

    got = [grads(x, y, DEV) for x, y in cases]  # all dispatched before the first sync
    for (x, y), g in zip(cases, got):
        assert torch.equal(g.cpu(), grads(x, y, "cpu")), f"gradient over {tuple(x.shape)} differs from CPU"


def test_foreach_ops_with_misaligned_tensors_match_cpu_bits():
    torch.manual_seed(2)
    shapes = [(65544,), (256, 256), (70001,), (17, 19)]
    xs = [torch.randn(s) for s in shapes]
    ys = [torch.randn(s) for s in shapes]
    dx = [x.to(DEV) for x in xs]
    dy = [y.to(DEV) for y in ys]
    for _ in range(4):
        torch._foreach_mul_(xs, 0.9)
        torch._foreach_addcmul_(xs, ys, ys, value=0.1)
        xs = torch._foreach_sigmoid(xs)
        torch._foreach_mul_(dx, 0.9)
        torch._foreach_addcmul_(dx, dy, dy, value=0.1)
        dx = torch._foreach_sigmoid(dx)
    for x, d in zip(xs, dx):
        assert torch.equal(d.cpu(), x), f"foreach chain over {tuple(x.shape)} differs from CPU"


def _process_threads():
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(torch.get_num_threads() < 2, reason="one intra-op thread: no OpenMP team to free")
def test_a_long_host_wait_frees_the_host_team_and_results_stay_cpu_exact():
    # A host thread blocked on the device for 5 ms frees its OpenMP team (backend/stream.cpp),
    # so the worker's team may spin between regions (backend/worker_threads.cpp, SpinBallast).
    torch.manual_seed(2)
    x = torch.randn(1 << 22)
    w = torch.randn(768, 768) / 28
    wd = w.to(DEV)
    torch.tanh(wd @ wd).cpu()  # the worker has run: its team (and the ballast's) exist
    time.sleep(0.2)
    # A parallel CPU op: the host thread has a team now (a long wait above may have
    # freed an earlier one).
    total = (x * 2).sum()
    before = _process_threads()
    yd = wd
    for _ in range(40):  # tens of milliseconds of queued device work, all waited for
        yd = torch.tanh(yd @ wd)  # below (the CPU reference runs after the count)
    torch.neuron.synchronize()
    after = _process_threads()
    assert after < before, f"{before} threads before the wait, {after} after: the host's team was not freed"
    y = w
    for _ in range(40):
        y = torch.tanh(y @ w)
    assert torch.equal(yd.cpu(), y)
    # CPU work on the host goes on (a new team) with the same result.
    assert torch.equal((x * 2).sum(), total)


@pytest.mark.skipif(torch.get_num_threads() < 2, reason="one intra-op thread: no OpenMP team to spin")
def test_the_worker_team_spins_only_placed_and_stops_when_the_host_resumes():
    # backend/worker_threads.cpp, set_team_spinning: while the host waits long, a team placed
    # on CPUs of its own (large items) spins between regions; once the host works again the
    # worker ends the spin in progress (counter team_spin_stops). Small items never place
    # the team, so a long wait on them never makes it spin.
    import neuron_eager

    if os.environ.get("NEURON_PIN_WORKERS", "1") == "0":
        pytest.skip("NEURON_PIN_WORKERS=0: the team is never placed, so it never spins")
    torch.manual_seed(3)
    w = torch.randn(768, 768) / 28
    wd = w.to(DEV)
    torch.neuron.synchronize()

    def stops():
        return neuron_eager.counters().get("team_spin_stops", 0)

    small = torch.randn(64, 64, device=DEV)
    # Unplace the team (an earlier test may have left it placed): a product whose bits
    # depend on the thread count runs on the team while the host works (sleeps here).
    p, q = torch.randn(10, 64, device=DEV), torch.randn(64, 256, device=DEV)
    torch.neuron.synchronize()
    torch.mm(p, q)
    time.sleep(0.05)
    before = stops()
    for _ in range(3):
        s = small
        for _ in range(4000):  # well over 5 ms of queued one-thread work, waited for
            s = torch.tanh(s * 1.01)
        s.cpu()
        (small + 1).cpu()  # the host works again: the worker runs an item
    assert stops() == before, "a team that was never placed was stopped: it spun"

    yd = wd
    for _ in range(3):
        for _ in range(40):  # tens of milliseconds of large items, waited for
            yd = torch.tanh(yd @ wd)
        torch.neuron.synchronize()
        (small + 1).cpu()
    assert stops() > before, "the placed team spun through a long wait and was never stopped"
    y = w
    for _ in range(120):
        y = torch.tanh(y @ w)
    assert torch.equal(yd.cpu(), y)
