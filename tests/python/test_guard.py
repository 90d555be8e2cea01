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


def shape_cycle(rows, steps, cols=64):
    """chain() on inputs whose row count cycles through `rows` (a batch size that changes
    every step): one segment key per shape, all of one family. Returns the results and
    the counters' changes."""
    xs = [torch.randn(r, cols, generator=torch.Generator().manual_seed(r)) for r in rows]
    xns = [x.to("neuron") for x in xs]
    before = neuron_eager.counters()
    outs = [(i % len(rows), chain(xns[i % len(rows)]).cpu()) for i in range(steps)]
    after = neuron_eager.counters()
    for k, o in outs:
        assert torch.equal(o, chain(xs[k]))
    return {c: after[c] - before[c] for c in after}


# A verdict after 3 pairs, always a demotion (a program must halve the time to stay), and
# no re-trial within the test (tier 1 only: a kernel arriving would start one).
DEMOTING = {"guard_min_pairs": 3, "guard_max_pairs": 3, "guard_margin": 1.0,
            "guard_early_pairs": 3, "guard_retry_after": 1000000, "min_group_elements": 0,
            "tier": "instant"}


@pytest.mark.parametrize("share", [True, False])
def test_keys_that_differ_only_in_shape_share_one_trial(adaptive, share):
    # Six shapes, each seen every sixth step: with guard_family the six keys' occurrences
    # pair up in one trial (a verdict within a few rounds); without it each key has its own.
    neuron_eager.set_policy({**DEMOTING, "guard_family": share})
    d = shape_cycle(range(40, 46), 60)
    assert d["programs"] >= 6, d
    verdicts = d["guard_demotions"] + d["guard_undecided"] + d["guard_kept"]
    if share:
        assert 1 <= d["guard_trials"] <= d["programs"] // 3, d
        assert verdicts == d["guard_trials"], d
    else:
        assert d["guard_trials"] == d["programs"], d
    # Every key follows its verdict: nothing fuses any more.
    assert shape_cycle(range(40, 46), 12)["segments_fused"] == 0


def test_a_new_shape_starts_with_its_familys_verdict(adaptive):
    # (Recording never settles here: a stream with nothing to decide would stop seeing
    # the new shapes.)
    neuron_eager.set_policy({**DEMOTING, "settle_cuts": 0})
    d = shape_cycle(range(40, 46), 60)
    assert d["guard_trials"] >= 1 and d["guard_kept"] == 0, d
    # Shapes never seen get programs once hot, demoted from the start: no trial, no fused run.
    d = shape_cycle(range(50, 53), 15)
    assert d["programs"] >= 3, d
    assert d["guard_trials"] == 0 and d["segments_fused"] == 0, d


@pytest.mark.parametrize("key,value", [("guard", "sometimes"), ("guard_alpha", "2"),
                                       ("guard_min_pairs", "0"), ("guard_retry_max", "-3")])
def test_bad_guard_knobs_get_one_clear_error(key, value, tmp_path):
    f = tmp_path / "p.policy"
    f.write_text(f"{key} = {value}\n")
    with pytest.raises(ValueError, match=key):
        neuron_eager.set_policy(str(f))
    assert neuron_eager.get_policy()["guard"] in (True, False)  # the active policy is intact


_TWO_PROCESS_SCRIPT = """
import json, os
import torch, neuron_eager
neuron_eager.set_mode("adaptive")
# A margin of 1 keeps nothing: every trial ends in a demotion (the verdicts kept on disk).
policy = {"guard_margin": 1.0, "min_group_elements": 0}
if os.environ.get("FORGET"):
    policy["guard_remember"] = False
neuron_eager.set_policy(policy)
def chain(x):
    return ((x * 3 - 1).sigmoid() + x).mul(0.5).tanh()
x = torch.randn(256, 512, generator=torch.Generator().manual_seed(0))
expected, xn = chain(x), x.to("neuron")
for _ in range(80):
    assert torch.equal(chain(xn).cpu(), expected)
c = neuron_eager.counters()
print(json.dumps({k: c.get(k, 0) for k in
                  ("guard_trials", "guard_remembered", "guard_kept", "guard_demotions", "guard_undecided")}))
"""


def test_a_second_process_starts_from_the_demotions_of_the_first(tmp_path):
    # Demotions are kept in the cache folder (fusion/verdict_store.h): a process sharing it
    # starts those keys per op without a trial; guard_remember=false (a different policy,
    # so a different folder too) tries them again.
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, NEURON_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("NEURON_FUSION_POLICY", None)

    def run_process(**extra):
        out = subprocess.run([sys.executable, "-c", _TWO_PROCESS_SCRIPT], env={**env, **extra},
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    first = run_process()
    verdicts = first["guard_demotions"] + first["guard_undecided"]
    assert first["guard_trials"] >= 1 and verdicts >= 1 and first["guard_remembered"] == 0, first
    assert first["guard_kept"] == 0, first
    assert list((tmp_path / "cache").glob("verdicts-v1/*/*")), "no verdict was kept"
    second = run_process()
    assert second["guard_remembered"] >= 1, second
    assert second["guard_trials"] <= first["guard_trials"] - second["guard_remembered"], (first, second)
    forgetting = run_process(FORGET="1")
    assert forgetting["guard_remembered"] == 0 and forgetting["guard_trials"] >= 1, forgetting
