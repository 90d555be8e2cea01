"""Summaries of a trace as data: top ops, segments, syncs by cause, device time per-op vs
fused, memory and queue peaks (counters.py), the online guard's verdicts (guard.py),
totals. Everything is grouped with numpy (bincount/unique), so summarising millions of
events takes no per-event Python loop.

    s = summarize(load("run.ntrace"))
    s.ops[0].name, s.ops[0].device_total_ns      # the op with the most device time
    s.to_dict()                                  # plain JSON-ready data
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from .format import (COMPILE_END, COMPILE_START, CUT_REASONS, FALLBACK, KEY_HIT, KEY_MISS,
                     OP_DISPATCH, OP_EXECUTE, SEGMENT_CUT, SEGMENT_EXECUTE, SYNC, Trace)
from .format import COLLECTIVE
from .counters import MemoryStat, QueueStat, counters
from .guard import (GuardSummary, choose_speedup, occurrence_rank, steady_averages,
                    summarize_guard, warmup_occurrences)


@dataclass
class OpStat:
    name: str
    op_id: int
    calls: int                # OpDispatch events
    host_total_ns: int
    host_avg_ns: float
    executions: int           # OpExecute events
    device_total_ns: int
    device_avg_ns: float
    device_share: float       # of all device time (per-op + fused)
    fallbacks: int


@dataclass
class SegmentStat:
    key: int
    key_hex: str
    length: int               # ops (the most common length seen for the key)
    count: int                # SegmentCut occurrences
    cut_reasons: Dict[str, int]
    hits: int
    misses: int
    measured: int             # per-op occurrences whose ops' executions are in the trace
    per_op_device_total_ns: int   # executions of the ops of occurrences that ran per op
    per_op_device_avg_ns: float   # per measured per-op occurrence
    state: str                # cold, repeated, compiling, compiled, fused
    fused_count: int          # occurrences that ran fused
    fused_groups: int         # SegmentExecute events of those occurrences
    fused_total_ns: int       # their SegmentExecutes + their ops' executions outside them
    fused_avg_ns: float       # per fused occurrence
    compiles: int
    compile_ns: int
    tier: int
    speedup: Optional[float]  # per-op / fused time per occurrence, like with like (basis)
    first_ops: List[str]      # op names of the first occurrence (up to 8)
    speedup_basis: str = ""   # guard, steady or all: see guard.py
    verdict: str = ""         # the guard's latest verdict for the key ("" if none)


@dataclass
class SyncStat:
    cause: str
    count: int
    total_wait_ns: int
    avg_wait_ns: float
    max_wait_ns: int
    stack: str                # Python stack of the first occurrence ("" if none)


@dataclass
class CollectiveStat:
    call: str                 # c10d call (allreduce, allgather_into_tensor, send, ...)
    group: str
    count: int
    total_bytes: int
    total_ns: int             # the collective stream's time in these calls
    avg_ns: float
    max_ns: int


@dataclass
class FallbackStat:
    op: str
    reason: str
    count: int


@dataclass
class DeviceTime:
    per_op_ns: int            # OpExecute
    fused_ns: int             # SegmentExecute
    compile_ns: int           # CompileEnd
    total_ns: int             # per-op + fused
    fused_share: float


@dataclass
class Totals:
    events: int
    ops: int                  # dispatched
    executed: int
    duration_ns: int
    host_ns: int
    device_ns: int
    sync_count: int
    sync_wait_ns: int
    fallbacks: int
    segment_cuts: int
    segment_keys: int
    key_hits: int
    key_misses: int
    threads: int
    complete: bool
    file_bytes: Optional[int]
    bytes_per_op: Optional[float]
    events_per_op: Optional[float]


@dataclass
class Summary:
    metadata: Dict[str, Any]
    totals: Totals
    ops: List[OpStat]
    segments: List[SegmentStat]
    syncs: List[SyncStat]
    fallbacks: List[FallbackStat]
    device: DeviceTime
    memory: List[MemoryStat] = field(default_factory=list)
    queues: List[QueueStat] = field(default_factory=list)
    guard: GuardSummary = field(default_factory=GuardSummary)
    collectives: List[CollectiveStat] = field(default_factory=list)

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


def _group(keys: np.ndarray, weights: Optional[np.ndarray] = None
           ) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Distinct keys, their counts, weight sums and the first index of each key."""
    if len(keys) == 0:
        z = np.zeros(0, dtype=np.int64)
        return keys[:0], z, z.astype(np.float64), z
    uniq, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    counts = np.bincount(inverse, minlength=len(uniq))
    sums = (np.bincount(inverse, weights=weights.astype(np.float64), minlength=len(uniq))
            if weights is not None else np.zeros(len(uniq)))
    return uniq, counts, sums, first


def _avg(total: float, n: int) -> float:
    return float(total) / n if n else 0.0


def _nested(exe: np.ndarray, spans: np.ndarray) -> np.ndarray:
    """For each execution, whether it starts inside a span of `spans` on its own thread
    (an op a fused segment ran itself)."""
    out = np.zeros(len(exe), dtype=bool)
    for thread in np.intersect1d(np.unique(exe["thread"]), np.unique(spans["thread"])).tolist():
        sp = spans[spans["thread"] == thread]
        order = np.argsort(sp["time_ns"], kind="stable")
        start = sp["time_ns"][order]
        end = start + sp["duration_ns"][order]
        sel = np.nonzero(exe["thread"] == thread)[0]
        t = exe["time_ns"][sel]
        pos = np.searchsorted(start, t, side="right") - 1
        out[sel] = (pos >= 0) & (t < end[np.maximum(pos, 0)])
    return out


def _top_ops(trace: Trace, disp, exe, fb, device_total: int) -> List[OpStat]:
    n = int(max([trace.ops and max(trace.ops) or 0] +
                [int(a["op"].max()) for a in (disp, exe, fb) if len(a)])) + 1
    calls = np.bincount(disp["op"], minlength=n)
    host = np.bincount(disp["op"], weights=disp["duration_ns"].astype(np.float64), minlength=n)
    execs = np.bincount(exe["op"], minlength=n)
    dev = np.bincount(exe["op"], weights=exe["duration_ns"].astype(np.float64), minlength=n)
    fbs = np.bincount(fb["op"], minlength=n)
    present = np.nonzero((calls + execs + fbs)[1:])[0] + 1
    order = sorted(present.tolist(), key=lambda i: (-dev[i], -host[i], trace.op_name(i)))
    return [OpStat(trace.op_name(i), i, int(calls[i]), int(host[i]), _avg(host[i], calls[i]),
                   int(execs[i]), int(dev[i]), _avg(dev[i], execs[i]),
                   _avg(dev[i], device_total), int(fbs[i])) for i in order]


def _segments(trace: Trace, ev: np.ndarray, exe: np.ndarray, disp: np.ndarray,
              guard: GuardSummary) -> List[SegmentStat]:
    kind = ev["kind"]
    cuts = ev[kind == SEGMENT_CUT]
    fused = ev[kind == SEGMENT_EXECUTE]
    comp_end = ev[kind == COMPILE_END]
    comp_start = ev[kind == COMPILE_START]
    # Each cut occurrence covers seqs [seq, seq + length). It ran fused when a
    # SegmentExecute of its key starts inside it (a segment may run as several groups);
    # its fused time is then those SegmentExecutes plus the executions of its ops outside
    # them (ops released before the cut, ops the plan leaves to ATen). Otherwise its ops'
    # executions are its per-op time. Occurrences are matched by binary search over the
    # cuts sorted by seq, so nothing here loops per event in Python.
    corder = np.argsort(cuts["seq"], kind="stable")
    cseq, cend = cuts["seq"][corder], cuts["seq"][corder] + cuts["aux"][corder]

    def occurrence(seqs: np.ndarray) -> np.ndarray:
        """Index into `cuts` of the occurrence holding each seq, -1 where none does."""
        pos = np.searchsorted(cseq, seqs, side="right") - 1
        inside = (pos >= 0) & (seqs < cend[np.maximum(pos, 0)])
        return np.where(inside, corder[np.maximum(pos, 0)], -1)

    n_cuts = len(cuts)
    f_occ = occurrence(fused["seq"]) if n_cuts else np.full(len(fused), -1)
    f_match = f_occ >= 0
    f_match[f_match] = cuts["value"][f_occ[f_match]] == fused["value"][f_match]
    occ_fused_ns = np.bincount(f_occ[f_match], weights=fused["duration_ns"][f_match]
                               .astype(np.float64), minlength=n_cuts).astype(np.float64)
    occ_groups = np.bincount(f_occ[f_match], minlength=n_cuts)
    is_fused = occ_groups > 0
    e_occ = occurrence(exe["seq"]) if n_cuts else np.full(len(exe), -1)
    e_in = e_occ >= 0
    e_dur = exe["duration_ns"].astype(np.float64)
    occ_dev = np.bincount(e_occ[e_in], weights=e_dur[e_in], minlength=n_cuts).astype(np.float64)
    occ_execs = np.bincount(e_occ[e_in], minlength=n_cuts)
    outside = e_in & ~_nested(exe, fused)
    occ_fused_ns += np.bincount(e_occ[outside], weights=e_dur[outside], minlength=n_cuts) \
        * is_fused
    occ_dev = np.where(is_fused, 0.0, occ_dev)
    measured = ((occ_execs > 0) & ~is_fused).astype(np.int64)

    keys, counts, dev_sum, first = _group(cuts["value"], occ_dev)
    _, _, meas_sum, _ = _group(cuts["value"], measured)
    inverse = np.searchsorted(keys, cuts["value"])
    # Length per key: the usual case is one length; keys seen with several take the mode.
    lmin = np.full(len(keys), np.iinfo(np.uint64).max, dtype=np.uint64)
    lmax = np.zeros(len(keys), dtype=np.uint64)
    np.minimum.at(lmin, inverse, cuts["aux"])
    np.maximum.at(lmax, inverse, cuts["aux"])
    reason_counts = {int(r): np.bincount(inverse, weights=(cuts["flags"] == r),
                                         minlength=len(keys)).astype(np.int64)
                     for r in np.unique(cuts["flags"]).tolist()}
    stats: Dict[int, Dict[str, Any]] = {}
    for i, key in enumerate(keys.tolist()):
        length = int(lmin[i])
        if lmin[i] != lmax[i]:
            lengths, lcounts = np.unique(cuts["aux"][inverse == i], return_counts=True)
            length = int(lengths[np.argmax(lcounts)])
        stats[key] = dict(
            length=length, count=int(counts[i]),
            cut_reasons={CUT_REASONS.get(r, f"reason {r}"): int(c[i])
                         for r, c in reason_counts.items() if c[i]},
            measured=int(meas_sum[i]), per_op=int(dev_sum[i]),
            first_seq=int(cuts["seq"][first[i]]))

    def by_key(arr, weights=None):
        k, c, s, f = _group(arr["value"], weights)
        return {int(key): (int(ci), float(si), int(fi)) for key, ci, si, fi in zip(k, c, s, f)}

    hits = by_key(ev[kind == KEY_HIT])
    misses = by_key(ev[kind == KEY_MISS])
    # Per key: fused occurrences, their time and their groups; SegmentExecutes that lie in
    # no cut of their key (a trace cut short) count one occurrence each.
    f_occ_n, f_occ_ns, f_occ_groups = (np.bincount(inverse, weights=w, minlength=len(keys))
                                       for w in (is_fused, occ_fused_ns, occ_groups))
    fused_by = {int(k): [int(n), float(ns), int(g)] for k, n, ns, g in
                zip(keys.tolist(), f_occ_n.tolist(), f_occ_ns.tolist(), f_occ_groups.tolist())}
    fused_first = by_key(fused)
    unmatched = by_key(fused[~f_match], fused["duration_ns"][~f_match])
    for key, (n, ns, _) in unmatched.items():
        entry = fused_by.setdefault(key, [0, 0.0, 0])
        entry[0] += n
        entry[1] += ns
        entry[2] += n
    fused_by = {k: v for k, v in fused_by.items() if v[0]}
    steady = steady_averages(keys, inverse, occurrence_rank(cuts["value"], cuts["seq"]),
                             guard.steady_warmup, occ_dev, measured, is_fused, occ_fused_ns,
                             {k: (n, ns) for k, (n, ns, _) in unmatched.items()})
    guard_by = guard.by_key()
    comp_by = by_key(comp_end, comp_end["duration_ns"])
    started = by_key(comp_start)
    all_keys = set(stats) | set(fused_by) | set(comp_by) | set(started)
    dseq_order = np.argsort(disp["seq"], kind="stable")
    dseq = disp["seq"][dseq_order]

    out = []
    for key in all_keys:
        st = stats.get(key, {})
        length = st.get("length", 0)
        f_n, f_sum, f_groups = fused_by.get(key, (0, 0.0, 0))
        if not length and f_n:
            length = int(fused["aux"][fused_first[key][2]])
        c_n, c_sum, c_first = comp_by.get(key, (0, 0.0, 0))
        tier = int(comp_end["aux"][comp_end["value"] == key].max()) if c_n else 0
        count = st.get("count", 0)
        if f_n:
            state = "fused"
        elif c_n:
            state = "compiled"
        elif key in started:
            state = "compiling"
        else:
            state = "repeated" if count > 1 or key in hits else "cold"
        per_op_avg = _avg(st.get("per_op", 0), st.get("measured", 0))
        fused_avg = _avg(f_sum, f_n)
        speedup, basis = choose_speedup(key, guard_by, steady, per_op_avg, fused_avg)
        first_ops: List[str] = []
        if "first_seq" in st and len(dseq):
            a = np.searchsorted(dseq, st["first_seq"], side="left")
            b = np.searchsorted(dseq, st["first_seq"] + min(length, 8), side="left")
            first_ops = [trace.op_name(o) for o in disp["op"][dseq_order[a:b]].tolist()]
        out.append(SegmentStat(
            key=key, key_hex=f"{key:016x}", length=length, count=count,
            cut_reasons=st.get("cut_reasons", {}), hits=hits.get(key, (0,))[0],
            misses=misses.get(key, (0,))[0], measured=st.get("measured", 0),
            per_op_device_total_ns=st.get("per_op", 0), per_op_device_avg_ns=per_op_avg,
            state=state, fused_count=f_n, fused_groups=f_groups, fused_total_ns=int(f_sum),
            fused_avg_ns=fused_avg,
            compiles=c_n, compile_ns=int(c_sum), tier=tier,
            speedup=speedup, first_ops=first_ops, speedup_basis=basis,
            verdict=guard_by[key].verdict if key in guard_by else ""))
    out.sort(key=lambda s: (-(s.per_op_device_total_ns + s.fused_total_ns), -s.count,
                            s.key))
    return out


def _syncs(trace: Trace, syncs: np.ndarray) -> List[SyncStat]:
    causes, counts, waits, _ = _group(syncs["value"], syncs["duration_ns"])
    out = []
    for cause, n, wait in zip(causes.tolist(), counts.tolist(), waits.tolist()):
        sel = syncs[syncs["value"] == cause]
        with_stack = sel["aux"][sel["aux"] != 0]
        out.append(SyncStat(trace.string(cause) or "(unknown)", n, int(wait), _avg(wait, n),
                            int(sel["duration_ns"].max()),
                            trace.string(with_stack[0]) if len(with_stack) else ""))
    out.sort(key=lambda s: (-s.total_wait_ns, -s.count, s.cause))
    return out


def _collectives(trace: Trace, coll: np.ndarray) -> List[CollectiveStat]:
    out = []
    pairs = sorted({(int(v), int(r)) for v, r in zip(coll["value"].tolist(), coll["reserved"].tolist())})
    for value, group in pairs:
        sel = coll[(coll["value"] == value) & (coll["reserved"] == group)]
        total = int(sel["duration_ns"].sum(dtype=np.uint64))
        out.append(CollectiveStat(trace.string(value), trace.string(group), len(sel),
                                  int(sel["aux"].sum(dtype=np.uint64)), total, _avg(total, len(sel)),
                                  int(sel["duration_ns"].max())))
    out.sort(key=lambda c: (-c.total_ns, c.call, c.group))
    return out


def _fallbacks(trace: Trace, fb: np.ndarray) -> List[FallbackStat]:
    if len(fb) == 0:
        return []
    pairs = (fb["op"].astype(np.uint64) << np.uint64(32)) | (fb["value"] & np.uint64(0xFFFFFFFF))
    uniq, counts, _, _ = _group(pairs)
    out = [FallbackStat(trace.op_name(int(p) >> 32), trace.string(int(p) & 0xFFFFFFFF), int(c))
           for p, c in zip(uniq.tolist(), counts.tolist())]
    out.sort(key=lambda f: (-f.count, f.op, f.reason))
    return out


def summarize(trace: Trace) -> Summary:
    """The summaries of a loaded trace (see the dataclasses of this module)."""
    ev = trace.events
    kind = ev["kind"]
    disp = ev[kind == OP_DISPATCH]
    exe = ev[kind == OP_EXECUTE].copy()
    if len(exe) and (exe["op"] == 0).any() and len(disp):
        # Executions that do not name their op take it from the dispatch with their seq.
        order = np.argsort(disp["seq"], kind="stable")
        pos = np.minimum(np.searchsorted(disp["seq"][order], exe["seq"]), len(disp) - 1)
        match = disp["seq"][order][pos] == exe["seq"]
        fill = (exe["op"] == 0) & match
        exe["op"][fill] = disp["op"][order][pos][fill]
    fb = ev[kind == FALLBACK]
    syncs = ev[kind == SYNC]
    per_op = int(exe["duration_ns"].sum(dtype=np.uint64))
    fused_ns = int(ev["duration_ns"][kind == SEGMENT_EXECUTE].sum(dtype=np.uint64))
    compile_ns = int(ev["duration_ns"][kind == COMPILE_END].sum(dtype=np.uint64))
    device = DeviceTime(per_op, fused_ns, compile_ns, per_op + fused_ns,
                        _avg(fused_ns, per_op + fused_ns))
    guard = summarize_guard(ev)
    guard.steady_warmup = warmup_occurrences(trace.metadata)
    segments = _segments(trace, ev, exe, disp, guard)
    memory, queues = counters(ev)
    n_ops = len(disp)
    size = trace.file_size
    totals = Totals(
        events=len(ev), ops=n_ops, executed=len(exe), duration_ns=trace.duration_ns,
        host_ns=int(disp["duration_ns"].sum(dtype=np.uint64)), device_ns=device.total_ns,
        sync_count=len(syncs), sync_wait_ns=int(syncs["duration_ns"].sum(dtype=np.uint64)),
        fallbacks=len(fb), segment_cuts=int((kind == SEGMENT_CUT).sum()),
        segment_keys=len(segments), key_hits=int((kind == KEY_HIT).sum()),
        key_misses=int((kind == KEY_MISS).sum()),
        threads=len(set(trace.threads) | set(np.unique(ev["thread"]).tolist())),
        complete=trace.complete, file_bytes=size,
        bytes_per_op=(size / n_ops) if size is not None and n_ops else None,
        events_per_op=(len(ev) / n_ops) if n_ops else None)
    return Summary(dict(trace.metadata), totals, _top_ops(trace, disp, exe, fb, device.total_ns),
                   segments, _syncs(trace, syncs), _fallbacks(trace, fb), device, memory, queues,
                   guard, _collectives(trace, ev[kind == COLLECTIVE]))
