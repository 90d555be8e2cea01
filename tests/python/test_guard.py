"""The online guard (issue 21): a hot key's program runs interleaved with per-op runs of
the same key and stays only if it wins; results equal CPU eager's whatever it decides.
The verdict rule itself is unit-tested in tests/cpp/test_guard.cpp."""

import pytest
import torch

import neuron_eager
from neuron_eager import trace as ntrace


def chain(x):
    return ((x * 3 - 1).sigmoid() + x).mul(0.5).tanh()


@pytest.fixture
def adaptive():
    previous = neuron_eager.get_mode()
    neuron_eager.set_mode("adaptive")
    neuron_eager.reset_fusion_state()
    yield
    neuron_eager.set_mode(previous)
    neuron_eager.set_policy("default")
    neuron_eager.reset_fusion_state()


def run(xn, n):
    return [chain(xn).cpu() for _ in range(n)]


def test_a_program_that_cannot_win_by_the_margin_is_demoted_and_runs_per_op(adaptive, tmp_path):
    # Five pairs per trial, and a program must halve the key's median time to stay: a 4-op
    # chain on 64 elements cannot (holding its ops costs more than it saves), so it is
    # demoted (only 3 of 5 pairs with a per-op outlier of 2x could keep it).
    policy = {"guard_min_pairs": 5, "guard_max_pairs": 5, "guard_margin": 0.5,
              "guard_early_pairs": 5, "min_group_elements": 0}
    neuron_eager.set_policy({**policy, "guard_retry_after": 1000000})
    x = torch.randn(64)
    expected = chain(x)
    xn = x.to("neuron")
    path = tmp_path / "g.ntrace"
    before = neuron_eager.counters()
    with ntrace.record(str(path)):
        outs = run(xn, 20)
    mid = neuron_eager.counters()
    outs += run(xn, 10)
    after = neuron_eager.counters()
    for o in outs:
        assert torch.equal(o, expected)
    # One trial per hot key (the chain is one key, or two when the stream left by an
    # earlier test cuts its first occurrence elsewhere), each ending in a demotion.
    trials = mid["guard_trials"] - before["guard_trials"]
    assert trials >= 1
    assert mid["guard_demotions"] + mid["guard_undecided"] - before["guard_demotions"] - before["guard_undecided"] == trials
    assert after["segments_fused"] == mid["segments_fused"]  # demoted: nothing fused since
    t = ntrace.load(str(path))
    verdicts = t.events[t.events["kind"] == 16]
    assert len(verdicts) == trials
    for v in verdicts:
        assert v["flags"] in (2, 3) and v["op"] == 5  # demoted after 5 pairs
        assert v["aux"] > 0 and v["seq"] > 0         # both medians measured
    states = t.events[t.events["kind"] == 17]
    moves = [(int(f) >> 8, int(f) & 0xFF) for f in states["flags"]]
    assert (0, 1) in moves and (1, 2) in moves and (2, 5) in moves  # cold->hot->on_trial->demoted
    # A new policy re-tries demoted keys at once.
    neuron_eager.set_policy(policy)
    outs = run(xn, 6)
    for o in outs:
        assert torch.equal(o, expected)
    assert neuron_eager.counters()["guard_retrials"] > after["guard_retrials"]


def test_guard_off_fuses_every_hot_key_without_trials(adaptive):
    neuron_eager.set_policy({"guard": False, "min_group_elements": 0})
    x = torch.randn(4096)
    expected = chain(x)
    xn = x.to("neuron")
    before = neuron_eager.counters()
    outs = run(xn, 10)
    after = neuron_eager.counters()
    for o in outs:
        assert torch.equal(o, expected)
    assert after["guard_trials"] == before["guard_trials"]
    assert after["segments_fused"] - before["segments_fused"] >= 6


def test_trial_results_equal_cpu_in_both_modes(adaptive):
    # Default guard: the trial alternates fused and per-op runs; every result is exact.
    x = torch.randn(256, 512)
    expected = chain(x)
    xn = x.to("neuron")
    before = neuron_eager.counters()
    outs = run(xn, 40)
    after = neuron_eager.counters()
    for o in outs:
        assert torch.equal(o, expected)
    assert after["guard_trials"] > before["guard_trials"]
    stats = neuron_eager._C.segment_cache_stats()
    assert stats["illegal_transitions"] == 0, stats
    assert stats["transitions"].get("hot->on_trial", 0) >= 1, stats


@pytest.mark.parametrize("key,value", [("guard", "sometimes"), ("guard_alpha", "2"),
                                       ("guard_min_pairs", "0"), ("guard_retry_max", "-3")])
def test_bad_guard_knobs_get_one_clear_error(key, value, tmp_path):
    f = tmp_path / "p.policy"
    f.write_text(f"{key} = {value}\n")
    with pytest.raises(ValueError, match=key):
        neuron_eager.set_policy(str(f))
    assert neuron_eager.get_policy()["guard"] in (True, False)  # the active policy is intact
