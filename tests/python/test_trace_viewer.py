"""Trace files from the Python side: loader, summaries, Perfetto JSON, HTML report (checked
in headless Chromium), diff, errors on damaged files and the neuron-trace command.

Traces are synthesised here with a tiny writer of the documented format
(docs/trace-format.md), so every expected number is known from how the file was built.
"""

import json
import os
import random
import shutil
import struct
import subprocess
import sys
import time
import zlib
from collections import Counter, defaultdict
from html.parser import HTMLParser

import numpy as np
import pytest

import neuron_eager
import neuron_eager.trace as nt
from neuron_eager.trace import perfetto, summarize
from neuron_eager.trace.diff import diff
from neuron_eager.trace.format import EVENT_DTYPE

# ---- a writer of the format -----------------------------------------------------------

DISPATCH, EXECUTE, SYNC, CUT, HIT, MISS, MEM, QUEUE, FALLBACK, CSTART, CEND, SEGEXEC = \
    range(1, 13)
VERDICT, STATE = 16, 17  # GuardVerdict, SegmentState
KEPT, DEMOTED, UNDECIDED = 1, 2, 3
COLD, HOT, ON_TRIAL, READY1, READY2, DEMOTED_STATE, BLACKLISTED = range(7)


def chunk(ctype, raw, *, crc=None, stored=None, raw_len=None):
    stored = zlib.compress(raw) if stored is None else stored
    crc = zlib.crc32(stored) if crc is None else crc
    return struct.pack("<IIII", ctype, len(raw) if raw_len is None else raw_len, len(stored),
                       crc) + stored


def header(version=1):
    return b"NEURONTR" + struct.pack("<II", version, 0)


def js(obj):
    return json.dumps(obj).encode()


def event(kind, t, dur=0, seq=0, value=0, aux=0, op=0, thread=1, core=0, stream=0,
          flags=0, reserved=0):
    return (t, dur, seq, value, aux, op, thread, kind, core, stream, flags, reserved)


def verdict(t, key, fused_ns, per_op_ns, samples, trial, flag):
    """A GuardVerdict as trace/event.h lays it out."""
    return event(VERDICT, t, seq=per_op_ns, value=key, aux=fused_ns, op=samples,
                 reserved=trial, flags=flag)


def state(t, key, frm, to, occurrences):
    return event(STATE, t, value=key, aux=occurrences, flags=(frm << 8) | to)


def events_bytes(evs):
    return np.array(evs, dtype=EVENT_DTYPE).tobytes()


OPS = {1: "aten::mm", 2: "aten::add.Tensor", 3: "aten::relu", 4: "aten::nonzero"}
STACK = '  File "train.py", line 12, in <module>\n    loss.item()'
STRINGS = {1: "item", 2: STACK, 3: "synchronize", 4: "data-dependent output shape"}
THREADS = {1: "host 1", 2: "worker neuron:0 stream 0"}
KEY = 0xDEADBEEF12345678
KEY2 = 0x0123456789ABCDEF


def workload(iters=20, adaptive=True):
    """Events of a small training-like loop: per iteration mm, add, relu dispatched on the
    host and executed on the worker, a segment cut per iteration, an `item` sync every 5
    iterations; one fallback; then (adaptive) a compile and fused executions.
    Returns (events, expected) with the numbers a summary must find."""
    evs, exp = [], defaultdict(int)
    exp["host"], exp["dev"], exp["calls"] = Counter(), Counter(), Counter()
    t = 1000
    seq = 0
    worker_free = 0
    for i in range(iters):
        first = seq
        for op, host_ns, dev_ns in ((1, 3000, 20000), (2, 1500, 4000), (3, 1000, 3000)):
            seq += 1
            evs.append(event(DISPATCH, t, host_ns, seq, value=0xAB00 + op, op=op))
            start = max(t + host_ns, worker_free) + 500
            evs.append(event(EXECUTE, start, dev_ns, seq, op=op, thread=2))
            evs.append(event(QUEUE, t + host_ns, value=1 + (i % 3), thread=1))
            worker_free = start + dev_ns
            exp["host"][op] += host_ns
            exp["dev"][op] += dev_ns
            exp["calls"][op] += 1
            exp["seg_dev"] += dev_ns
            t += host_ns + 200
        evs.append(event(CUT, t, seq=first + 1, value=KEY, aux=3, flags=3))
        evs.append(event(MISS if i == 0 else HIT, t, value=KEY, aux=i))
        evs.append(event(MEM, t, value=(i + 1) << 20, aux=(i + 2) << 20, thread=2))
        t += 100
        if i % 5 == 4:
            wait = worker_free - t
            evs.append(event(SYNC, t, wait, value=1, aux=2 if i == 4 else 0))
            exp["sync_wait"] += wait
            exp["syncs"] += 1
            t += wait + 100
    # one op that ran synchronously, with its own one-op segment
    seq += 1
    evs.append(event(DISPATCH, t, 8000, seq, op=4))
    evs.append(event(FALLBACK, t + 100, op=4, value=4))
    evs.append(event(SYNC, t + 200, 5000, value=3))  # nested in the dispatch
    evs.append(event(EXECUTE, max(t + 8000, worker_free) + 100, 7000, seq, op=4, thread=2))
    worker_free = max(t + 8000, worker_free) + 7100
    evs.append(event(CUT, t + 8000, seq=seq, value=KEY2, aux=1, flags=1))
    evs.append(event(MISS, t + 8000, value=KEY2))
    exp["host"][4] += 8000
    exp["dev"][4] += 7000
    exp["calls"][4] += 1
    exp["sync_wait"] += 5000
    exp["syncs"] += 1
    t = max(t + 8100, worker_free) + 1000
    if adaptive:
        evs.append(event(CSTART, t, value=KEY, thread=3))
        evs.append(event(CEND, t, 90000, value=KEY, aux=2, thread=3))
        t += 91000
        for _ in range(4):
            evs.append(event(SEGEXEC, t, 9000, value=KEY, aux=3, thread=2))
            t += 10000
        exp["fused"] = 4 * 9000
        exp["compile"] = 90000
    exp["ops"] = sum(exp["calls"].values())
    exp["iters"] = iters
    return evs, exp


def trace_bytes(evs, *, meta=None, end=True, split=True, version=1, extra=b""):
    meta = {"mode": "adaptive", "policy": "default", "pid": 4242, "cores": 1} \
        if meta is None else meta
    out = header(version) + chunk(1, js(meta))
    out += chunk(2, js({"ops": {str(k): v for k, v in OPS.items() if k <= 2},
                        "strings": {"1": STRINGS[1]}, "threads": {"1": THREADS[1]}}))
    host = [e for e in evs if e[6] != 2]
    work = [e for e in evs if e[6] == 2]
    parts = [work, host] if split else [evs]  # worker chunk first: out of time order
    for p in parts:
        if p:
            out += chunk(3, events_bytes(p))
    out += extra
    out += chunk(2, js({"ops": {str(k): v for k, v in OPS.items() if k > 2},
                        "strings": {str(k): v for k, v in STRINGS.items() if k > 1},
                        "threads": {"2": THREADS[2], "3": "compiler 3"}}))
    if end:
        out += chunk(4, struct.pack("<Q", len(evs)))
    return out


@pytest.fixture
def small(tmp_path):
    evs, exp = workload()
    path = tmp_path / "small.ntrace"
    path.write_bytes(trace_bytes(evs))
    return path, evs, exp


# ---- loading ---------------------------------------------------------------------------

def test_load_round_trip(small):
    path, evs, _ = small
    tr = nt.load(path)
    assert tr.metadata == {"mode": "adaptive", "policy": "default", "pid": 4242, "cores": 1}
    assert tr.ops == OPS and tr.strings == STRINGS  # merged from two strings chunks
    assert tr.threads == {**THREADS, 3: "compiler 3"}
    assert tr.complete and tr.declared_events == len(evs) == len(tr)
    assert tr.file_size == os.path.getsize(path)
    expected = np.sort(np.array(evs, dtype=EVENT_DTYPE), order="time_ns", kind="stable")
    assert np.array_equal(np.sort(tr.events, order=list(EVENT_DTYPE.names)),
                          np.sort(expected, order=list(EVENT_DTYPE.names)))
    assert (np.diff(tr.events["time_ns"].astype(np.int64)) >= 0).all()  # sorted by time
    recs = tr.to_records()
    assert len(recs) == len(evs)
    kinds = Counter(r["kind"] for r in recs)
    assert kinds["OpDispatch"] == 61 and kinds["OpExecute"] == 61 and kinds["Fallback"] == 1
    sync = next(r for r in recs if r["kind"] == "Sync")
    assert sync["detail"] == "item" and sync["thread"] == "host 1" and sync["op"] == ""
    mm = next(r for r in recs if r["kind"] == "OpExecute")
    assert mm["op"] == "aten::mm" and mm["thread"] == "worker neuron:0 stream 0"
    cut = next(r for r in recs if r["kind"] == "SegmentCut")
    assert cut["detail"] == "content" and cut["value"] == KEY
    df = tr.dataframe()
    assert len(df) == len(evs)


def test_unknown_chunk_types_are_skipped(tmp_path):
    evs, _ = workload(3, adaptive=False)
    p = tmp_path / "x.ntrace"
    p.write_bytes(trace_bytes(evs, extra=chunk(99, b"future data")))
    tr = nt.load(p)
    assert len(tr) == len(evs) and tr.skipped_chunks == [99]


# ---- damaged files -----------------------------------------------------------------------

def err(data, tmp_path, **kw):
    p = tmp_path / "bad.ntrace"
    p.write_bytes(data)
    with pytest.raises(nt.TraceFormatError) as e:
        nt.load(p, **kw)
    assert isinstance(e.value, ValueError)
    return str(e.value)


def test_truncated_files_name_the_offset(tmp_path):
    evs, _ = workload(5)
    data = trace_bytes(evs)
    assert "inside the 16-byte file header" in err(data[:10], tmp_path)
    assert "(at byte offset 10)" in err(data[:10], tmp_path)
    meta_end = 16 + 16 + len(zlib.compress(js({"mode": "adaptive", "policy": "default",
                                                 "pid": 4242, "cores": 1})))
    msg = err(data[:meta_end + 7], tmp_path)
    assert "truncated" in msg and f"chunk starting at byte {meta_end}" in msg
    assert f"(at byte offset {meta_end + 7})" in msg and "not closed" in msg
    msg = err(data[:meta_end + 40], tmp_path)
    assert "data ends inside the strings chunk" in msg and f"offset {meta_end + 40})" in msg
    no_end = trace_bytes(evs, end=False)
    msg = err(no_end, tmp_path)
    assert "no end chunk" in msg and "not closed" in msg
    assert f"(at byte offset {len(no_end)})" in msg
    p = tmp_path / "partial.ntrace"  # what it holds can still be read on request
    p.write_bytes(no_end)
    tr = nt.load(p, allow_incomplete=True)
    assert not tr.complete and len(tr) == len(evs) and tr.ops == OPS


def test_corrupt_chunks(tmp_path):
    evs, _ = workload(5)
    good = trace_bytes(evs)
    meta = chunk(1, js({"mode": "eager"}))
    ev_off = 16 + len(meta)
    body = bytearray(header() + meta + chunk(3, events_bytes(evs)) +
                     chunk(4, struct.pack("<Q", len(evs))))
    body[ev_off + 40] ^= 0xFF
    msg = err(bytes(body), tmp_path)
    assert "corrupt events chunk" in msg and "CRC-32 mismatch" in msg
    assert f"(at byte offset {ev_off})" in msg
    msg = err(header() + meta + chunk(3, b"", stored=b"not zlib at all"), tmp_path)
    assert "does not decompress" in msg and f"offset {ev_off})" in msg
    msg = err(header() + chunk(1, b"{not json"), tmp_path)
    assert "corrupt metadata chunk" in msg and "JSON" in msg and "offset 16)" in msg
    msg = err(header() + chunk(1, b"[1, 2]"), tmp_path)
    assert "expected a JSON object" in msg
    msg = err(header() + chunk(2, js({"ops": {"x": "aten::mm"}})), tmp_path)
    assert "non-numeric id 'x'" in msg
    msg = err(header() + chunk(3, b"\0" * 55), tmp_path)
    assert "not a multiple of the 56-byte record" in msg
    msg = err(header() + chunk(3, b"\0" * 56, raw_len=112), tmp_path)
    assert "decompresses to 56 bytes, header says 112" in msg
    msg = err(header() + meta + chunk(4, struct.pack("<Q", 7)), tmp_path)
    assert "end chunk says 7 events" in msg
    msg = err(b"PK\x03\x04" + good[4:], tmp_path)
    assert "not a neuron trace file (bad magic" in msg and "(at byte offset 0)" in msg
    msg = err(good + b"junk", tmp_path)
    assert "4 unexpected bytes after the end chunk" in msg
    assert f"(at byte offset {len(good)})" in msg


def test_newer_version_is_rejected(tmp_path):
    evs, _ = workload(2)
    msg = err(trace_bytes(evs, version=2), tmp_path)
    assert "written by a newer format version 2; this reader supports up to 1" in msg


def test_every_truncation_and_random_damage_gives_trace_format_error(tmp_path):
    evs, _ = workload(3)
    data = trace_bytes(evs)
    for n in range(len(data)):  # never an exception from struct/zlib/json/numpy
        with pytest.raises(nt.TraceFormatError):
            nt.parse(data[:n])
    rng = random.Random(7)
    damaged = 0
    for _ in range(300):
        b = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        try:
            nt.parse(bytes(b))
        except nt.TraceFormatError:
            damaged += 1
    assert damaged >= 250  # flips inside the CRC-protected payloads are always caught


# ---- summaries ----------------------------------------------------------------------------

def test_segment_speedup_compares_whole_occurrences():
    """A segment [mm, add, relu] runs per op twice, then fused three times the way adaptive
    mode runs it: mm (an ATen op of the plan) as its own execution before the group, add and
    relu as two fused groups, and one relu rerun per op inside its failed group. Per-op
    and fused times are taken per occurrence: per-op occurrences' executions on one side;
    every SegmentExecute of a fused occurrence plus its ops' executions outside them on the
    other; nested executions are not counted twice."""
    evs, t, seq = [], 1000, 0
    per_op = fused = 0
    for i in range(5):
        first = seq + 1
        if i < 2:
            for op, dev in ((1, 20000), (2, 4000), (3, 3000)):
                seq += 1
                evs.append(event(DISPATCH, t, 1000, seq, op=op))
                evs.append(event(EXECUTE, t + 1000, dev, seq, op=op, thread=2))
                t += dev + 2000
                per_op += dev
        else:
            for op in (1, 2, 3):
                seq += 1
                evs.append(event(DISPATCH, t + op * 1000, 1000, seq, op=op))
            evs.append(event(EXECUTE, t, 20000, first, op=1, thread=2))   # outside: counted
            evs.append(event(SEGEXEC, t + 20000, 2000, first + 1, value=KEY, aux=3, thread=2))
            evs.append(event(SEGEXEC, t + 22000, 3000, first + 2, value=KEY, aux=3, thread=2))
            evs.append(event(EXECUTE, t + 22500, 2000, first + 2, op=3, thread=2))  # nested
            fused += 20000 + 2000 + 3000
            t += 30000
        evs.append(event(CUT, t, seq=first, value=KEY, aux=3, flags=3))
    s = summarize(nt.parse(trace_bytes(evs)))
    g = {x.key: x for x in s.segments}[KEY]
    assert (g.count, g.measured, g.fused_count, g.fused_groups) == (5, 2, 3, 6)
    assert g.per_op_device_total_ns == per_op == 2 * 27000
    assert g.fused_total_ns == fused == 3 * 25000
    assert g.per_op_device_avg_ns == 27000 and g.fused_avg_ns == 25000
    assert g.speedup == pytest.approx(27000 / 25000)
    # a trace with fused occurrences only has no per-op time to compare against
    only_fused = [e for e in evs if e[2] > 6 or e[7] not in (EXECUTE, DISPATCH, CUT)]
    g = {x.key: x for x in summarize(nt.parse(trace_bytes(only_fused))).segments}[KEY]
    assert (g.count, g.measured, g.fused_count, g.speedup) == (3, 0, 3, None)


def test_summary_counts_equal_what_was_written(small):
    path, evs, exp = small
    s = summarize(nt.load(path))
    t = s.totals
    assert t.ops == exp["ops"] == 61 and t.executed == 61 and t.events == len(evs)
    assert t.sync_count == exp["syncs"] and t.sync_wait_ns == exp["sync_wait"]
    assert t.fallbacks == 1 and t.segment_cuts == 21 and t.segment_keys == 2
    assert t.key_misses == 2 and t.key_hits == 19
    assert t.file_bytes == os.path.getsize(path)
    assert t.bytes_per_op == pytest.approx(os.path.getsize(path) / 61)
    by = {o.name: o for o in s.ops}
    assert set(by) == set(OPS.values())
    for op, name in OPS.items():
        o = by[name]
        assert o.calls == exp["calls"][op] and o.executions == exp["calls"][op]
        assert o.host_total_ns == exp["host"][op] and o.device_total_ns == exp["dev"][op]
        assert o.device_avg_ns == pytest.approx(exp["dev"][op] / exp["calls"][op])
    assert [o.name for o in s.ops][0] == "aten::mm"  # most device time first
    assert by["aten::nonzero"].fallbacks == 1
    per_op = sum(exp["dev"].values())
    assert s.device.per_op_ns == per_op and s.device.fused_ns == exp["fused"]
    assert s.device.compile_ns == exp["compile"]
    assert s.device.fused_share == pytest.approx(exp["fused"] / (per_op + exp["fused"]))
    assert sum(o.device_share for o in s.ops) == pytest.approx(1 - s.device.fused_share)

    seg = {g.key: g for g in s.segments}
    g = seg[KEY]
    assert (g.length, g.count, g.hits, g.misses, g.measured) == (3, 20, 19, 1, 20)
    assert g.cut_reasons == {"content": 20} and g.key_hex == f"{KEY:016x}"
    assert g.per_op_device_total_ns == exp["seg_dev"] == 20 * 27000
    assert g.state == "fused" and g.fused_count == 4 and g.fused_total_ns == 36000
    assert g.fused_groups == 4  # executions outside any cut: one occurrence each
    assert g.compiles == 1 and g.compile_ns == 90000 and g.tier == 2
    assert g.speedup == pytest.approx(27000 / 9000)
    assert g.first_ops == ["aten::mm", "aten::add.Tensor", "aten::relu"]
    g2 = seg[KEY2]
    assert (g2.length, g2.count, g2.state, g2.per_op_device_total_ns) == (1, 1, "cold", 7000)
    assert g2.cut_reasons == {"sync": 1} and g2.speedup is None

    sy = {y.cause: y for y in s.syncs}
    assert sy["item"].count == 4 and sy["item"].stack == STACK
    assert sy["synchronize"].count == 1 and sy["synchronize"].total_wait_ns == 5000
    assert sy["synchronize"].stack == ""
    assert [(f.op, f.reason, f.count) for f in s.fallbacks] == \
        [("aten::nonzero", "data-dependent output shape", 1)]
    assert s.memory[0].peak_allocated == 20 << 20 and s.memory[0].peak_reserved == 21 << 20
    assert s.queues[0].max_depth == 3 and s.queues[0].samples == 60
    json.dumps(s.to_dict())  # plain data


def test_eager_trace_has_no_fused_time(tmp_path):
    evs, exp = workload(10, adaptive=False)
    p = tmp_path / "e.ntrace"
    p.write_bytes(trace_bytes(evs))
    s = summarize(nt.load(p))
    assert s.device.fused_ns == 0 and s.device.fused_share == 0
    assert {g.key: g.state for g in s.segments}[KEY] == "repeated"


def occurrences(plan, key=KEY, t=1000, seq=0):
    """Occurrences of a 3-op segment of `key`: ("p", ns) runs per op (three executions
    of ns / 3), ("f", ns) runs fused (one SegmentExecute of ns). Returns (events, t, seq)."""
    evs = []
    for mode, ns in plan:
        first = seq + 1
        for i, op in enumerate((1, 2, 3)):
            seq += 1
            evs.append(event(DISPATCH, t + i * 100, 100, seq, op=op))
            if mode == "p":
                evs.append(event(EXECUTE, t + 1000 + i * ns // 3, ns // 3, seq, op=op,
                                 thread=2))
        if mode == "f":
            evs.append(event(SEGEXEC, t + 1000, ns, first, value=key, aux=3, thread=2))
        evs.append(event(CUT, t + 500, seq=first, value=key, aux=3, flags=3))
        t += ns + 5000
    return evs, t, seq


def test_speedup_compares_steady_occurrences(tmp_path):
    """The first occurrences of a key run per op while cold (first kernel runs, fresh
    memory); the speedup compares occurrences after the first hot_threshold + 2 only, so
    the cold ones no longer inflate it. Without steady occurrences on one side it falls
    back to all of them, and says so; a guard verdict beats both."""
    plan = [("p", 120000)] * 3 + [("f", 20000)] * 2 + [("p", 30000), ("f", 20000)] * 4
    evs, t, _ = occurrences(plan)
    meta = {"mode": "adaptive", "policy": {"name": "default", "hot_threshold": 3}}
    s = summarize(nt.parse(trace_bytes(evs, meta=meta)))
    g = {x.key: x for x in s.segments}[KEY]
    assert (g.count, g.measured, g.fused_count) == (13, 7, 6)
    assert g.per_op_device_avg_ns == pytest.approx((3 * 120000 + 4 * 30000) / 7)  # all
    assert g.fused_avg_ns == 20000
    assert s.guard.steady_warmup == 5 and not s.guard.present
    assert (g.speedup, g.speedup_basis, g.verdict) == (pytest.approx(1.5), "steady", "")
    p = tmp_path / "steady.ntrace"
    p.write_bytes(trace_bytes(evs, meta=meta))
    r = run_cli("summary", str(p))
    assert r.returncode == 0, r.stderr
    assert "1.50x s" in r.stdout and "3.43x" not in r.stdout
    assert "speedup: per-op time / fused time per occurrence" in r.stdout
    assert "s = steady occurrences only: each key's first 5 skipped as cold" in r.stdout
    assert "Guard:" not in r.stdout
    # a policy whose hot_threshold leaves no steady per-op occurrence: all of them, marked
    meta10 = {"mode": "adaptive", "policy": {"name": "x", "hot_threshold": 10}}
    g = {x.key: x for x in summarize(nt.parse(trace_bytes(evs, meta=meta10))).segments}[KEY]
    assert g.speedup_basis == "all"
    assert g.speedup == pytest.approx((3 * 120000 + 4 * 30000) / 7 / 20000)
    # the guard's own paired figures win over both
    evs.append(verdict(t, KEY, 24000, 30000, 10, 1, KEPT))
    g = {x.key: x for x in summarize(nt.parse(trace_bytes(evs, meta=meta))).segments}[KEY]
    assert (g.speedup, g.speedup_basis, g.verdict) == (pytest.approx(1.25), "guard", "kept")


def guard_events():
    """KEY: demoted on its first trial, kept on its re-trial, now ready_tier1; KEY2:
    undecided after 64 samples, demoted; KEY3: blacklisted (no verdict in the trace)."""
    evs, t, _ = occurrences([("p", 30000)] * 3 + [("f", 20000)] * 3)
    key3 = 0x00000000CAFE0003
    evs += [state(t, KEY, COLD, HOT, 3), state(t + 10, KEY, HOT, ON_TRIAL, 3),
            verdict(t + 20, KEY, 12000, 10000, 8, 1, DEMOTED),
            state(t + 30, KEY, ON_TRIAL, DEMOTED_STATE, 19),
            state(t + 40, KEY, DEMOTED_STATE, ON_TRIAL, 50),
            verdict(t + 50, KEY, 8000, 10000, 12, 2, KEPT),
            state(t + 60, KEY, ON_TRIAL, READY1, 74),
            state(t + 70, KEY2, HOT, ON_TRIAL, 3),
            verdict(t + 80, KEY2, 9900, 10000, 64, 1, UNDECIDED),
            state(t + 90, KEY2, ON_TRIAL, DEMOTED_STATE, 131),
            state(t + 100, key3, DEMOTED_STATE, BLACKLISTED, 400)]
    return evs, key3


def test_guard_verdicts_and_states(tmp_path):
    evs, key3 = guard_events()
    p = tmp_path / "guard.ntrace"
    p.write_bytes(trace_bytes(evs))
    tr = nt.load(p)
    s = summarize(tr)
    g = s.guard
    assert (g.verdicts, g.kept, g.demotions, g.undecided, g.retrials, g.blacklisted,
            g.transitions) == (3, 1, 2, 1, 1, 1, 8)
    assert g.states == {"ready_tier1": 1, "demoted": 1, "blacklisted": 1}
    assert [k.key for k in g.keys] == [KEY, KEY2, key3]
    k1, k2, k3 = g.keys
    assert (k1.verdict, k1.fused_period_ns, k1.per_op_period_ns, k1.samples) == \
        ("kept", 8000, 10000, 12)
    assert k1.ratio == pytest.approx(0.8) and k1.speedup == pytest.approx(1.25)
    assert (k1.trials, k1.retrials, k1.verdicts, k1.demotions) == (2, 1, 2, 1)
    assert (k1.state, k1.state_occurrence, k1.transitions) == ("ready_tier1", 74, 5)
    assert k1.history == ["demoted", "kept"] and k1.key_hex == f"{KEY:016x}"
    assert (k2.verdict, k2.samples, k2.retrials, k2.demotions, k2.state) == \
        ("undecided", 64, 0, 1, "demoted")
    assert k2.ratio == pytest.approx(0.99)
    assert (k3.verdict, k3.state, k3.ratio, k3.verdicts) == ("", "blacklisted", None, 0)
    seg = {x.key: x for x in s.segments}[KEY]
    assert (seg.speedup, seg.speedup_basis, seg.verdict) == (pytest.approx(1.25), "guard",
                                                           "kept")
    json.dumps(s.to_dict())
    # readable columns: a verdict's op field holds samples, not an op id
    recs = [r for r in tr.to_records() if r["kind"] in ("GuardVerdict", "SegmentState")]
    assert [r["detail"] for r in recs if r["kind"] == "GuardVerdict"] == \
        ["demoted", "kept", "undecided"]
    assert all(r["op"] == "" for r in recs)
    assert recs[1]["detail"] == "hot -> on_trial" and recs[-1]["detail"] == \
        "demoted -> blacklisted"
    # neuron-trace summary
    r = run_cli("summary", str(p))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert ("Guard: 3 verdicts on 2 keys: 1 kept, 2 demotions (1 undecided), 1 re-trials; "
            "8 state transitions") in out
    row = next(line for line in out.splitlines()
               if line.startswith(f"{KEY:016x}") and "ready_tier1" in line)
    for cell in ("kept", "0.800", "1.25x", "8.00 us", "10.00 us", "12", "demoted kept"):
        assert cell in row, (cell, row)
    assert "1.25x g" in out and "g = the guard's paired medians" in out
    row2 = next(line for line in out.splitlines() if line.startswith(f"{KEY2:016x}")
                and "undecided" in line)
    assert "0.990" in row2 and " 64 " in row2
    assert f"{key3:016x}  blacklisted" in out
    data = json.loads(run_cli("summary", str(p), "--json").stdout)
    assert data["guard"]["demotions"] == 2 and data["guard"]["keys"][0]["verdict"] == "kept"
    # Perfetto: instants for verdicts and transitions
    by, _ = check_chrome_trace(perfetto.chrome_trace(tr))
    inst = Counter(e["name"] for e in by["i"])
    assert inst["guard: kept"] == inst["guard: demoted"] == inst["guard: undecided"] == 1
    assert sum(n for name, n in inst.items() if name.startswith("state: ")) == 8
    # the HTML report's data
    from neuron_eager.trace import html as nh
    d = nh.report_data(tr)
    assert d["summary"]["guard"]["keys"][0]["key_hex"] == f"{KEY:016x}"
    assert "steady occurrences only" in d["speedup_legend"]


def test_policy_label(monkeypatch):
    """The recorded policy (a JSON object of every knob) reads as its name and the knobs
    that differ from the built-in of that name; never as '[object Object]'."""
    from neuron_eager.trace import html as nh
    from neuron_eager.trace import text as tx
    default = json.loads(neuron_eager._C._replay_policy("default", []))
    aggressive = json.loads(neuron_eager._C._replay_policy("aggressive", []))
    assert tx.policy_label("default") == "default" and tx.policy_label(None) == "?"
    assert tx.policy_label(default) == "default"
    assert tx.policy_label(dict(default, hot_threshold=5)) == "default (hot_threshold=5)"
    assert tx.policy_label(aggressive) == "aggressive"
    assert tx.policy_label(dict(default, name="mine", hot_threshold=5, lift_scalars=False)) \
        == "mine (hot_threshold=5, lift_scalars=false)"
    evs, _ = workload(3)
    meta = {"mode": "adaptive", "policy": dict(default, hot_threshold=5), "cores": 1}
    tr = nt.parse(trace_bytes(evs, meta=meta))
    assert "policy=default (hot_threshold=5) " in tx.format_summary(summarize(tr))
    page = nh.render(tr)
    assert '"policy_label":"default (hot_threshold=5)"' in page
    assert "[object Object]" not in page
    assert nh.report_data(tr)["summary"]["guard"]["verdicts"] == 0
    # without the engine's bindings: every knob, still readable
    tx._builtin_knobs.cache_clear()
    monkeypatch.setattr(neuron_eager, "_C", object())
    try:
        label = tx.policy_label(dict(default, hot_threshold=5))
    finally:
        tx._builtin_knobs.cache_clear()
    assert label.startswith("default (") and "hot_threshold=5" in label
    assert "max_segment_length=" in label


def test_diff(tmp_path):
    a_evs, _ = workload(10, adaptive=False)
    b_evs, _ = workload(15, adaptive=True)
    b_evs = [e for e in b_evs if e[5] != 4 and e[7] != FALLBACK and e[3] != KEY2]  # no nonzero
    pa, pb = tmp_path / "a.ntrace", tmp_path / "b.ntrace"
    pa.write_bytes(trace_bytes(a_evs))
    pb.write_bytes(trace_bytes(b_evs))
    d = diff(summarize(nt.load(pa)), summarize(nt.load(pb)))
    assert d.op("aten::nonzero").status == "removed"
    mm = d.op("aten::mm")
    assert (mm.status, mm.calls_a, mm.calls_b) == ("changed", 10, 15)
    seg = {g.key_hex: g for g in d.segments}
    assert seg[f"{KEY:016x}"].state_a == "repeated" and seg[f"{KEY:016x}"].state_b == "fused"
    assert seg[f"{KEY2:016x}"].status == "removed"
    same = diff(summarize(nt.load(pa)), summarize(nt.load(pa)))
    assert {o.status for o in same.ops} == {"same"}
    out = run_cli("diff", str(pa), str(pb))
    assert out.returncode == 0, out.stderr
    assert "aten::nonzero" in out.stdout and "removed" in out.stdout


# ---- Perfetto ------------------------------------------------------------------------------

def check_chrome_trace(obj):
    """Structural checks of Chrome Trace Event JSON; returns the events by phase."""
    assert set(obj) >= {"traceEvents", "displayTimeUnit"} and obj["displayTimeUnit"] == "ns"
    by = defaultdict(list)
    for e in obj["traceEvents"]:
        assert {"ph", "pid", "name"} <= set(e), e
        assert e["ph"] in {"M", "X", "s", "f", "C", "i"}, e
        if e["ph"] != "M":
            assert isinstance(e["ts"], float) and e["ts"] >= 0, e
        by[e["ph"]].append(e)
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in by["M"]
             if e["name"] == "thread_name"}
    assert any(e["name"] == "process_name" for e in by["M"])
    tracks = defaultdict(list)
    for e in by["X"]:
        assert isinstance(e["dur"], float) and e["dur"] >= 0
        assert (e["pid"], e["tid"]) in names, e
        tracks[(e["pid"], e["tid"])].append(e)
    for key, xs in tracks.items():  # well nested per track
        stack = []
        for e in sorted(xs, key=lambda e: (e["ts"], -e["dur"])):
            end = e["ts"] + e["dur"]
            while stack and stack[-1] <= e["ts"] + 1e-9:
                stack.pop()
            assert not stack or end <= stack[-1] + 1e-9, f"{names[key]}: {e} overlaps"
            stack.append(end)
    flows = defaultdict(list)
    for e in by["s"] + by["f"]:
        flows[e["id"]].append(e)
    for fid, pair in flows.items():
        assert sorted(p["ph"] for p in pair) == ["f", "s"], pair
        s, f = sorted(pair, key=lambda p: p["ph"] != "s")
        assert f["bp"] == "e" and s["ts"] <= f["ts"] and s["cat"] == f["cat"]
    for e in by["i"]:
        assert "reason" in e["args"] and e["s"] in "tpg"
    return by, names


def test_perfetto_json(small, tmp_path):
    path, evs, exp = small
    out = tmp_path / "out.json"
    r = run_cli("perfetto", str(path), "-o", str(out))
    assert r.returncode == 0, r.stderr
    obj = json.loads(out.read_text())
    by, names = check_chrome_trace(obj)
    assert set(names.values()) == {"host 1", "worker neuron:0 stream 0", "compiler"}
    cats = Counter(e["cat"] for e in by["X"])
    assert cats == {"dispatch": 61, "execute": 61, "sync": exp["syncs"], "segment": 4,
                    "compile": 1}
    assert len(by["s"]) == len(by["f"]) == 61
    mm = next(e for e in by["X"] if e["cat"] == "execute")
    assert mm["name"] == "aten::mm" and mm["ts"] == pytest.approx(4.5)  # 4500 ns
    assert mm["dur"] == pytest.approx(20.0)
    assert {e["name"] for e in by["C"]} == {"memory neuron:0", "queue neuron:0 stream 0"}
    assert len(by["C"]) == 20 + 60
    inst = Counter(e["name"] for e in by["i"])
    assert inst == {"key miss": 2, "fallback: aten::nonzero": 1}
    fb = next(e for e in by["i"] if e["cat"] == "fallback")
    assert fb["args"]["reason"] == "data-dependent output shape"
    assert all(e["pid"] == 4242 for e in obj["traceEvents"])


def test_perfetto_partial_overlap_goes_to_its_own_track(tmp_path):
    evs = [event(DISPATCH, 1000, 5000, 1, op=1), event(SYNC, 4000, 5000, value=1),
           event(EXECUTE, 7000, 100, 1, op=1, thread=2)]
    p = tmp_path / "o.ntrace"
    p.write_bytes(trace_bytes(evs))
    by, names = check_chrome_trace(perfetto.chrome_trace(nt.load(p)))
    assert sorted(names.values()) == ["host 1", "host 1 (2)", "worker neuron:0 stream 0"]
    assert len(by["s"]) == 1


# ---- HTML in headless Chromium -----------------------------------------------------------

CHROMIUM = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome")
                 if shutil.which(b)), None)


class DomIndex(HTMLParser):
    """Elements of a dumped DOM by id, and the rows of each class with their cell text."""

    def __init__(self):
        super().__init__()
        self.by_id, self.rows, self._row, self._cell = {}, defaultdict(list), None, None
        self.text, self._open = defaultdict(str), []  # text inside elements with an id

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.by_id[a["id"]] = a
        if tag in ("div", "span"):
            self._open.append(a.get("id"))
        if tag == "tr" and a.get("class"):
            self._row = (a["class"], a.get("id"), [])
        elif tag == "td" and self._row:
            self._cell = []

    def handle_data(self, data):
        for i in self._open:
            if i:
                self.text[i] += data
        if self._cell is not None:
            self._cell.append(data)

    def handle_endtag(self, tag):
        if tag in ("div", "span") and self._open:
            self._open.pop()
        if tag == "td" and self._row and self._cell is not None:
            self._row[2].append("".join(self._cell))
            self._cell = None
        elif tag == "tr" and self._row:
            self.rows[self._row[0]].append((self._row[1], self._row[2]))
            self._row = None


def browser_dom(html_path, fragment=""):
    out = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--window-size=1600,1000", "--virtual-time-budget=2000", "--dump-dom",
         f"file://{html_path}{fragment}"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    dom = DomIndex()
    dom.feed(out.stdout)
    return dom


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed "
                    "(tools/setup.sh installs it: apt-get install chromium)")
def test_html_report_renders_in_chromium(tmp_path):
    evs, exp = workload(3)  # few slices: all wide enough to be drawn at this size
    path = tmp_path / "r.ntrace"
    path.write_bytes(trace_bytes(evs))
    out = tmp_path / "report.html"
    r = run_cli("html", str(path), "-o", str(out))
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert "http://" not in text.replace("http://www.w3.org", "") and "https://" not in text
    dom = browser_dom(out)
    assert "errors" in dom.by_id and dom.text["errors"] == ""  # window.onerror writes here
    tl = dom.by_id["timeline"]
    n_slices = 10 + 10 + 1 + 4 + 1  # dispatch, execute, sync, fused, compile
    assert int(tl["data-total-slices"]) == n_slices
    assert int(tl["data-slices"]) == n_slices  # every slice drawn at full view
    assert int(tl["data-tracks"]) == 3
    ops = dom.rows["op-row"]
    assert [cells[0] for _, cells in ops][0] == "aten::mm"
    assert {cells[0] for _, cells in ops} == set(OPS.values())
    assert all(rid.startswith("op-row-") for rid, _ in ops)
    mm = next(cells for _, cells in ops if cells[0] == "aten::mm")
    assert mm[1] == "3" and mm[4] == "60.00 us"  # calls, device total
    segs = {rid: cells for rid, cells in dom.rows["segment-row"]}
    assert segs[f"segment-row-{KEY:016x}"][1] == "fused"
    assert len(dom.rows["sync-row"]) == 1 and len(dom.rows["fallback-row"]) == 1
    # zoomed in through the page's own view control: fewer slices drawn
    t_end = int(tl["data-view-end"])
    zoomed = browser_dom(out, f"#view=0,{t_end // 20}")
    z = zoomed.by_id["timeline"]
    assert int(z["data-view-end"]) == t_end // 20
    assert 0 < int(z["data-slices"]) < n_slices


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed "
                    "(tools/setup.sh installs it: apt-get install chromium)")
def test_html_report_of_a_larger_trace_limits_slices(tmp_path):
    evs, exp = workload(300)
    path = tmp_path / "big.ntrace"
    path.write_bytes(trace_bytes(evs))
    out = tmp_path / "big.html"
    assert run_cli("html", str(path), "-o", str(out), "--max-slices", "500").returncode == 0
    dom = browser_dom(out)
    tl = dom.by_id["timeline"]
    assert 490 <= int(tl["data-total-slices"]) <= 500  # each track's share, rounded down
    assert int(tl["data-tracks"]) == 3  # every track keeps some
    assert 0 < int(tl["data-slices"]) <= int(tl["data-total-slices"])  # sub-pixel merged
    assert "Showing" in dom.text.get("note", "")
    assert "data-error" not in dom.by_id.get("errors", {})


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed "
                    "(tools/setup.sh installs it: apt-get install chromium)")
def test_html_report_of_an_empty_trace(tmp_path):
    p = tmp_path / "empty.ntrace"
    p.write_bytes(header() + chunk(1, js({})) + chunk(4, struct.pack("<Q", 0)))
    out = tmp_path / "empty.html"
    assert run_cli("html", str(p), "-o", str(out)).returncode == 0
    dom = browser_dom(out)
    assert dom.text["errors"] == ""
    tl = dom.by_id["timeline"]
    assert (tl["data-slices"], tl["data-total-slices"], tl["data-tracks"]) == ("0", "0", "0")
    assert dom.by_id["ops-table"]["data-rows"] == "0"


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed "
                    "(tools/setup.sh installs it: apt-get install chromium)")
def test_html_report_shows_guard_and_policy(tmp_path):
    evs, key3 = guard_events()
    default = json.loads(neuron_eager._C._replay_policy("default", []))
    meta = {"mode": "adaptive", "policy": dict(default, hot_threshold=5), "cores": 1}
    path = tmp_path / "g.ntrace"
    path.write_bytes(trace_bytes(evs, meta=meta))
    out = tmp_path / "g.html"
    r = run_cli("html", str(path), "-o", str(out))
    assert r.returncode == 0, r.stderr
    dom = browser_dom(out)
    assert dom.text["errors"] == ""
    assert "[object Object]" not in dom.text["meta"]
    assert "policy=default (hot_threshold=5)" in dom.text["meta"]
    rows = {rid: cells for rid, cells in dom.rows["guard-row"]}
    assert dom.by_id["guard-table"]["data-rows"] == "3"
    k1 = rows[f"guard-row-{KEY:016x}"]
    assert k1[:5] == [f"{KEY:016x}", "ready_tier1", "kept", "0.800", "1.25x"]
    assert k1[5:] == ["8.00 us", "10.00 us", "12", "1", "1", "demoted kept"]
    k2 = rows[f"guard-row-{KEY2:016x}"]
    assert k2[1:4] == ["demoted", "undecided", "0.990"] and k2[7] == "64"
    assert rows[f"guard-row-{key3:016x}"][1:3] == ["blacklisted", "-"]
    assert "2 demotions (1 undecided), 1 re-trials" in dom.text["guard-summary"]
    seg = {rid: cells for rid, cells in dom.rows["segment-row"]}[f"segment-row-{KEY:016x}"]
    assert "1.25x g" in seg and "kept" in seg
    assert "g = the guard's paired medians" in dom.text["segments-legend"]


# ---- the command line -----------------------------------------------------------------------

def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "neuron_eager.trace.cli", *args],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})


def test_help_of_every_command():
    commands = ("summary", "perfetto", "html", "diff")
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    script = shutil.which("neuron-trace")  # the console script of pyproject.toml
    assert script is not None, "neuron-trace is not on PATH: reinstall the package"
    argvs = [[sys.executable, "-m", "neuron_eager.trace.cli", *a]
             for a in [["--help"]] + [[c, "--help"] for c in commands]]
    argvs.append([script, "summary", "--help"])
    procs = [subprocess.Popen(a, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env) for a in argvs]  # in parallel: each imports torch
    outs = [p.communicate(timeout=300) + (p.returncode,) for p in procs]
    top, *subs, script_out = outs
    assert top[2] == 0 and "usage: neuron-trace" in top[0], top[1]
    for cmd, (out, errs, rc) in zip(commands, subs):
        assert cmd in top[0]
        assert rc == 0 and f"usage: neuron-trace {cmd}" in out, errs
    assert "-o OUTPUT" in subs[1][0] and "--max-slices" in subs[2][0]
    assert script_out[2] == 0 and "--top" in script_out[0], script_out[1]


def test_summary_command(small):
    path, _, exp = small
    r = run_cli("summary", str(path))
    assert r.returncode == 0, r.stderr
    assert "Top ops by device time (4 distinct)" in r.stdout and "aten::mm" in r.stdout
    assert "Syncs by cause" in r.stdout and "loss.item()" in r.stdout
    assert f"{KEY:016x}" in r.stdout and "3.00x" in r.stdout  # segment speedup
    r = run_cli("summary", str(path), "--json")
    data = json.loads(r.stdout)
    assert data["totals"]["ops"] == 61 and data["ops"][0]["name"] == "aten::mm"


def test_cli_errors_are_one_line(tmp_path):
    p = tmp_path / "t.ntrace"
    evs, _ = workload(2)
    p.write_bytes(trace_bytes(evs)[:100])
    r = run_cli("summary", str(p))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.startswith("neuron-trace: error:") and "byte offset 100" in r.stderr
    r = run_cli("summary", str(tmp_path / "missing.ntrace"))
    assert r.returncode == 2 and "No such file" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("summary", str(p), "--allow-incomplete")
    assert r.returncode == 0 and "not closed" in r.stdout


# ---- scale ----------------------------------------------------------------------------------

def test_million_ops_load_and_summarize_in_seconds(tmp_path):
    n = 1_000_000
    seq = np.arange(1, n + 1, dtype=np.uint64)
    d = np.zeros(n, dtype=EVENT_DTYPE)
    d["time_ns"] = seq * 1000
    d["duration_ns"], d["seq"], d["op"], d["thread"], d["kind"] = 300, seq, seq % 50 + 1, 1, 1
    x = d.copy()
    x["time_ns"] += 400
    x["duration_ns"], x["thread"], x["kind"] = 500, 2, 2
    c = np.zeros(n // 10, dtype=EVENT_DTYPE)
    c["seq"] = seq[::10]
    c["time_ns"] = c["seq"] * 1000 + 9000
    c["value"], c["aux"], c["kind"], c["flags"] = c["seq"] % 7 + 1, 10, 4, 3
    body = header() + chunk(1, js({"mode": "eager"}))
    body += chunk(2, js({"ops": {str(i): f"aten::op{i}" for i in range(1, 51)}}))
    allev = np.concatenate([d, x, c])
    for i in range(0, len(allev), 65536):
        body += chunk(3, allev[i:i + 65536].tobytes())
    body += chunk(4, struct.pack("<Q", len(allev)))
    p = tmp_path / "m.ntrace"
    p.write_bytes(body)
    t0 = time.perf_counter()
    tr = nt.load(p)
    t1 = time.perf_counter()
    s = summarize(tr)
    t2 = time.perf_counter()
    assert len(tr) == 2_100_000 and s.totals.ops == n and len(s.ops) == 50
    assert sum(o.calls for o in s.ops) == n
    assert sum(g.count for g in s.segments) == n // 10 and len(s.segments) == 7
    assert sum(g.per_op_device_total_ns for g in s.segments) == n * 500
    assert t1 - t0 < 10 and t2 - t1 < 10, (t1 - t0, t2 - t1)


# ---- recording (needs the C++ recorder's bindings) -----------------------------------------

def test_missing_bindings_give_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(neuron_eager, "_C", object())
    with pytest.raises(RuntimeError, match="has no trace recorder .*trace_start"):
        nt.start(tmp_path / "x.ntrace")


@pytest.mark.skipif(not hasattr(neuron_eager._C, "trace_start"),
                    reason="this build has no trace recorder bindings yet (_C.trace_start)")
def test_record_round_trip(tmp_path):
    import torch

    path = tmp_path / "rec.ntrace"
    with nt.record(path, metadata={"test": "round trip"}) as rec:
        a = torch.ones(8, device="neuron")
        for _ in range(5):
            a = a + 1
        assert a.sum().item() == 8 * 6
    st = rec.stats
    assert st is not None and st.events > 0 and st.bytes == os.path.getsize(path)
    assert st.ops >= 6 and st.bytes_per_op > 0
    tr = nt.load(path)
    assert tr.metadata["mode"] in ("eager", "adaptive")
    s = summarize(tr)
    assert s.totals.ops == st.ops and s.totals.executed == st.ops  # stop() drained the queues
    assert any(o.name == "aten::add.Tensor" and o.calls == 5 for o in s.ops)
    assert [y.cause for y in s.syncs] == ["item"]  # the drain at stop() records no sync
    assert "a.sum().item()" in s.syncs[0].stack
    check_chrome_trace(perfetto.chrome_trace(tr))


@pytest.mark.skipif(not hasattr(neuron_eager._C, "trace_start"),
                    reason="this build has no trace recorder bindings yet (_C.trace_start)")
def test_record_keeps_python_metadata(tmp_path):
    """start(path, metadata) passes its JSON to _C.trace_start(path, metadata_json); the
    recorder must store it (merged with what the engine adds itself)."""
    path = tmp_path / "meta.ntrace"
    with nt.record(path, metadata={"test": "metadata"}):
        pass
    meta = nt.load(path).metadata
    assert meta.get("test") == "metadata", f"metadata_json was not stored: {meta}"
    assert "python_version" in meta and "argv" in meta
