"""Matmuls and dim reductions free of the intra-op thread count (backend/thread_trial.cpp):
a geometry seen a third time is tried on random inputs at one thread and at CPU eager's
count, once the worker is idle; only equal bits make it free. Whatever the verdict, results are CPU eager's bit for
bit, the trial never touches the user's random state, and shapes seen once never pay for
a trial."""

import time

import pytest
import torch

import neuron_eager

needs_two_threads = pytest.mark.skipif(
    torch.get_num_threads() < 2,
    reason="with one intra-op thread every item is free: no trial runs")


def trial_counts():
    """Trials done and geometries found free, once the idle worker ran every deferred one."""
    torch.neuron.synchronize()
    deadline = time.monotonic() + 30
    while True:
        c = neuron_eager.counters()
        if c["thread_trials"] + c["thread_trials_given_up"] >= c["thread_trials_deferred"]:
            return c["thread_trials"], c["thread_free_geometries"]
        assert time.monotonic() < deadline, f"deferred trials never ran on an idle worker: {c}"
        time.sleep(0.001)


def pair(*shape, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g)
    return x, x.to("neuron")


@needs_two_threads
def test_a_recurring_product_is_tried_once_and_stays_cpu_exact():
    neuron_eager.reset_counters()
    ac, a = pair(96, 272, seed=1)
    bc, b = pair(272, 208, seed=2)
    expected = torch.mm(ac, bc)
    for i in range(6):
        assert torch.equal(torch.mm(a, b).cpu(), expected), i
        trials, _ = trial_counts()
        assert trials == (0 if i < 2 else 1), (i, trials)  # tried after the third sighting
    assert neuron_eager.counters()["thread_trials_deferred"] == 1


@needs_two_threads
def test_shapes_seen_once_or_twice_are_never_tried():
    neuron_eager.reset_counters()
    for rows in range(40, 60):  # each geometry twice
        ac, a = pair(rows, 128, seed=rows)
        bc, b = pair(128, 160, seed=1000 + rows)
        for _ in range(2):
            assert torch.equal(torch.mm(a, b).cpu(), torch.mm(ac, bc))
    assert trial_counts() == (0, 0)


@needs_two_threads
def test_trials_leave_the_global_random_state_alone():
    torch.manual_seed(123)
    expected = torch.randn(16)
    torch.manual_seed(123)
    ac, a = pair(80, 144, seed=5)
    bc, b = pair(144, 112, seed=6)
    neuron_eager.reset_counters()
    for _ in range(4):
        torch.mm(a, b)
    assert trial_counts()[0] == 1
    assert torch.equal(torch.randn(16), expected)


@needs_two_threads
def test_many_geometries_match_cpu_whatever_the_verdict():
    """A sweep over products (tiny to large, transposed operands, addmm with a broadcast
    bias, bmm) and dim reductions: run each four times (tried at the third) and compare
    every run with CPU eager, bit for bit. Some geometries must come out free."""
    neuron_eager.reset_counters()
    cases = []
    for m, k, n in [(10, 64, 256), (64, 256, 256), (3, 700, 5), (128, 96, 40), (256, 64, 256),
                    (33, 257, 129), (1, 512, 512), (200, 8, 300)]:
        ac, a = pair(m, k, seed=m * 7 + k)
        bc, b = pair(k, n, seed=n * 11 + k)
        vc, v = pair(n, seed=m + n)
        cases.append((lambda p, q, s: torch.mm(p, q), (a, b, v), (ac, bc, vc)))
        cases.append((lambda p, q, s: torch.addmm(s, p, q, beta=0.5, alpha=2.0), (a, b, v), (ac, bc, vc)))
        cases.append((lambda p, q, s: torch.mm(q.t(), p.t()), (a, b, v), (ac, bc, vc)))
    xc, x = pair(6, 48, 80, seed=9)
    yc, y = pair(6, 80, 72, seed=10)
    cases.append((lambda p, q, s: torch.bmm(p, q), (x, y, None), (xc, yc, None)))
    for shape, dim in [((512, 300), 0), ((300, 512), 1), ((64, 40, 96), (0, 2))]:
        tc, t = pair(*shape, seed=len(shape) * 3 + sum(shape))
        cases.append((lambda p, q, s, d=dim: p.sum(d), (t, None, None), (tc, None, None)))
        cases.append((lambda p, q, s, d=dim: p.mean(d), (t, None, None), (tc, None, None)))
    for i, (fn, dev, cpu) in enumerate(cases):
        expected = fn(*cpu)
        for r in range(4):
            got = fn(*dev).cpu()
            assert torch.equal(got, expected), (i, r)
    trials, free = trial_counts()
    assert trials >= 20, trials
    assert 0 < free <= trials, (trials, free)
