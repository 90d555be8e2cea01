"""Adaptive mode pays nothing where fusion cannot help (issue 21): a stream whose cuts fuse
nothing and decide nothing stops recording for stretches of ops (Policy::settle_cuts), and
a ready program whose held prefix mostly goes on differently stops holding segment starts
(Policy::hold_min_missed_ops). Results equal CPU eager's either way; the rules themselves
are unit-tested in tests/cpp/test_policy.cpp."""

import json
import os
import subprocess
import sys

import torch

import neuron_eager
from neuron_eager import trace as ntrace

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench", "python"))

from test_guard import adaptive  # noqa: E402,F401  (the fixture: adaptive mode, fresh fusion state)


def body(x, w):
    return ((x * w + 1).sigmoid() - x).mul(0.5).tanh()


def loop(device, iterations, rows=lambda i: 64, read_every=25):
    torch.manual_seed(0)
    w = torch.randn(64).to(device)
    out, reads = [], []
    for i in range(iterations):
        x = torch.linspace(-2, 2, rows(i) * 64).reshape(rows(i), 64).to(device)
        y = body(x, w)
        out.append(y)
        if (i + 1) % read_every == 0:
            reads.append(y.sum().item())
    return [t.cpu() for t in out[-5:]], reads


# Every hot key fails the cost gate (no saving expected): nothing ever fuses. (The
# built-in "never" policy instead never lets a key get hot; its recurring cold keys keep
# the stream recording.)
NOTHING_FUSES = {"expected_repeats": 0}


def equal(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


def test_a_stream_with_nothing_to_fuse_settles_and_stays_exact(adaptive):
    cpu = loop("cpu", 300)
    neuron_eager.set_policy(NOTHING_FUSES)
    neuron_eager.reset_counters()
    got = loop("neuron", 300)
    c = neuron_eager.counters()
    assert equal(got[0], cpu[0]) and got[1] == cpu[1]
    assert c["settled_stretches"] >= 2, c
    # 300 iterations of 7 ops: all but the few cuts each stretch needs to settle again.
    assert c["ops_settled"] >= 0.6 * c["ops_queued"], c
    assert c["segments_fused"] == 0, c


def test_settle_cuts_zero_records_every_op(adaptive):
    neuron_eager.set_policy({**NOTHING_FUSES, "settle_cuts": 0})
    neuron_eager.reset_counters()
    loop("neuron", 200)
    assert neuron_eager.counters()["ops_settled"] == 0


def test_a_fusing_stream_never_settles(adaptive):
    # Guard off: every hot key runs fused, so every cut of the loop is productive.
    neuron_eager.set_policy({"guard": False, "min_group_elements": 0})
    cpu = loop("cpu", 300)
    neuron_eager.reset_counters()
    got = loop("neuron", 300)
    c = neuron_eager.counters()
    assert equal(got[0], cpu[0]) and got[1] == cpu[1]
    assert c["segments_fused"] > 200, c
    assert c["ops_settled"] == 0, c


def test_a_trace_sees_every_op_even_where_the_stream_would_settle(adaptive, tmp_path):
    neuron_eager.set_policy(NOTHING_FUSES)
    loop("neuron", 100)  # settled by now
    neuron_eager.reset_counters()
    path = str(tmp_path / "t.ntrace")
    with ntrace.record(path):
        loop("neuron", 100)
    c = neuron_eager.counters()
    assert c["ops_settled"] == 0, c
    from neuron_eager.trace import format as tformat
    t = tformat.load(path)
    assert len(t.of_kind(tformat.OP_DISPATCH)) == c["ops_dispatched"]
    assert len(t.of_kind(tformat.SEGMENT_CUT)) > 0


def test_a_settled_stream_fuses_a_new_loop_soon(adaptive):
    # Phase 1: a new shape every iteration, so every key is new: the stream settles.
    # Phase 2: a fixed-shape loop that fuses (guard off): recording resumes after the
    # stretch in progress and the loop's key becomes hot and runs fused.
    neuron_eager.set_policy({"guard": False, "min_group_elements": 0})
    neuron_eager.reset_counters()
    loop("neuron", 60, rows=lambda i: 8 + i)
    c = neuron_eager.counters()
    assert c["settled_stretches"] >= 1, c
    cpu = loop("cpu", 300)
    neuron_eager.reset_counters()
    got = loop("neuron", 300)
    c = neuron_eager.counters()
    assert equal(got[0], cpu[0]) and got[1] == cpu[1]
    # At most the longest stretch phase 1 reached (a few hundred ops) plus the
    # occurrences before the key is hot run per op; the rest runs fused.
    assert c["ops_in_fused_segments"] >= 0.6 * c["ops_queued"], c


# Keys recur but never get hot: every cut counts towards hotness, so the stream never
# settles by idle cuts; only a stream trial (fusion/stream_guard.h) lets ops pass
# unrecorded. Its statistics are unit-tested in tests/cpp/test_stream_guard.cpp; here the
# engine side: stretches really pass unrecorded, results stay exact, knobs apply.
NEVER_HOT = {"hot_threshold": 1000000, "settle_trial_after_ops": 256, "settle_trial_stretch_ms": 1}


def test_a_stream_trial_runs_unrecorded_stretches_and_stays_exact(adaptive):
    cpu = loop("cpu", 400, read_every=10)
    neuron_eager.set_policy(NEVER_HOT)
    neuron_eager.reset_counters()
    got = loop("neuron", 400, read_every=10)
    c = neuron_eager.counters()
    assert equal(got[0], cpu[0]) and got[1] == cpu[1]
    assert c["stream_trials"] >= 1, c
    # Every trial passes half of its stretches unrecorded, whatever it decides.
    assert c["ops_settled"] > 0, c
    assert c["settled_stretches"] == 0, c  # none of them came from idle cuts
    assert c["segments_fused"] == 0, c


def test_no_stream_trial_when_switched_off_or_ops_are_slower_than_the_bound(adaptive):
    for policy in ({**NEVER_HOT, "settle_trial": False}, {**NEVER_HOT, "settle_trial_max_op_us": 0}):
        neuron_eager.set_policy(policy)
        neuron_eager.reset_counters()
        loop("neuron", 200, read_every=10)
        c = neuron_eager.counters()
        assert c["stream_trials"] == 0 and c["ops_settled"] == 0, (policy, c)


def test_a_trace_stops_a_stream_trial(adaptive, tmp_path):
    neuron_eager.set_policy(NEVER_HOT)
    loop("neuron", 60, read_every=10)  # past settle_trial_after_ops: a trial runs
    neuron_eager.reset_counters()
    with ntrace.record(str(tmp_path / "t.ntrace")):
        loop("neuron", 100, read_every=10)
    c = neuron_eager.counters()
    assert c["ops_settled"] == 0 and c["stream_trials"] == 0, c


def test_reset_fusion_state_forgets_a_stream_trial(adaptive):
    neuron_eager.set_policy({**NEVER_HOT, "settle_trial_after_ops": 100000})
    neuron_eager.set_policy({**NEVER_HOT})  # counting towards a trial from here
    loop("neuron", 25, read_every=5)        # about 225 ops: no trial yet (256)
    neuron_eager.reset_fusion_state()       # counts from zero again
    neuron_eager.reset_counters()
    loop("neuron", 25, read_every=5)
    c = neuron_eager.counters()
    assert c["stream_trials"] == 0 and c["ops_queued"] < 256, c


def test_stream_trial_knobs_are_checked():
    import pytest
    with pytest.raises(ValueError, match="settle_trial_stretch_ms"):
        neuron_eager.set_policy({"settle_trial_stretch_ms": 0})
    with pytest.raises(ValueError, match="settle_trial"):
        neuron_eager.set_policy({"settle_trial": "maybe"})
    neuron_eager.set_policy("default")


def robust_program_cell_3():
    """A seeded program of bench/python/robust.py (seed 8686, cell 3): its loop body starts
    like the short segment cut at each host read, which occurs once per 500 iterations."""
    import robust
    from robust_programs import make_program

    class Args:
        seed, tiny, cells, workloads = 8686, False, 29, []
        sizes = [robust.parse_size(s) for s in robust.DEFAULT_SIZES.split(",")]
        reads = [1, 10, 100, 500]

    cell = robust.build_cells(Args)[3]
    assert cell["reads"] == 500
    return cell["program"], make_program


def run_prefix_case(policy):
    spec, make_program = robust_program_cell_3()
    neuron_eager.set_policy(policy)
    neuron_eager.reset_fusion_state()
    step, read, result = make_program(spec, "neuron")
    for i in range(200):
        step(i)
        if (i + 1) % 50 == 0:
            read()
    neuron_eager.reset_counters()
    for i in range(1000):
        step(i)
        if (i + 1) % 500 == 0:
            read()
    read()
    return neuron_eager.counters(), result()


def prefix_cases() -> dict:
    """Both cases, one after the other in this process (run in a fresh one by the test)."""
    # The guard demotes the loop's key (a margin of 1: no program is ever kept), so each
    # iteration's start matches only the rare read-time key's prefix, held in vain.
    # Content cuts by signature, as when this case was found: the read-time key then
    # starts like the loop's (by op kind alone the program is cut elsewhere).
    # The read-time key is still on trial here, and a key on trial holds only when its next
    # occurrence is planned fused; that plan is seeded by the key's family hash
    # (fusion/guard.cpp), so a change to how families hash can flip this case (a size class
    # in the family did: nothing held in either case, 0 divergences).
    base = {"settle_cuts": 0, "guard_margin": 1, "guard_min_pairs": 1, "guard_max_pairs": 2,
            "guard_retry_after": 1000000000, "rolling_shapes": True}
    neuron_eager.set_mode("adaptive")
    ruled, r1 = run_prefix_case(base)
    unruled, r2 = run_prefix_case({**base, "hold_min_missed_ops": 1000000})
    equal = True
    for a, b in zip(torch.utils._pytree.tree_leaves(r1), torch.utils._pytree.tree_leaves(r2)):
        equal &= bool(torch.equal(a.cpu(), b.cpu())) if isinstance(a, torch.Tensor) else a == b
    return {"ruled": ruled, "unruled": unruled, "equal": equal}


def test_a_prefix_that_rarely_becomes_its_key_stops_holding():
    # In a fresh process: after other tests in this one (state they leave that
    # reset_fusion_state does not cover) the unruled case diverged 122 times, not 499.
    p = subprocess.run([sys.executable, __file__, "--prefix-cases"], capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    ruled, unruled = r["ruled"], r["unruled"]
    # Held and released every other iteration (a release's ops and the next iteration's
    # start go into one segment): 499 of 1000 here, the same in every run.
    assert unruled["divergences"] >= 400, unruled
    assert ruled["prefix_holds_skipped"] >= 400, ruled
    assert ruled["divergences"] <= 100, ruled
    assert r["equal"]


if __name__ == "__main__" and sys.argv[1:] == ["--prefix-cases"]:
    print(json.dumps(prefix_cases()))
