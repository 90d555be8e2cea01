"""What changed between two traces, as data: totals, ops (by name, since op ids differ
between processes), segments (by key) and syncs (by cause)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

from .summary import Summary
from .text import fmt_ns


@dataclass
class TotalChange:
    name: str
    a: object
    b: object
    change: str


@dataclass
class OpChange:
    name: str
    status: str  # added, removed, changed, same
    calls_a: int
    calls_b: int
    device_a: int
    device_b: int
    avg_a: float
    avg_b: float
    host_a: int
    host_b: int


@dataclass
class SegmentChange:
    key_hex: str
    status: str
    length: int
    count_a: int
    count_b: int
    per_op_a: int
    per_op_b: int
    fused_a: int
    fused_b: int
    state_a: str
    state_b: str


@dataclass
class SyncChange:
    cause: str
    status: str
    count_a: int
    count_b: int
    wait_a: int
    wait_b: int


@dataclass
class TraceDiff:
    a_name: str
    b_name: str
    totals: List[TotalChange] = field(default_factory=list)
    ops: List[OpChange] = field(default_factory=list)
    segments: List[SegmentChange] = field(default_factory=list)
    syncs: List[SyncChange] = field(default_factory=list)

    def op(self, name: str) -> OpChange:
        return next(o for o in self.ops if o.name == name)


def _status(in_a: bool, in_b: bool, same: bool) -> str:
    if not in_a:
        return "added"
    if not in_b:
        return "removed"
    return "same" if same else "changed"


def _rel(a, b, time_tolerance: float) -> bool:
    """Whether two times are the same within a relative tolerance."""
    return abs(a - b) <= time_tolerance * max(abs(a), abs(b))


def _change(a, b, ns: bool = False) -> str:
    if a is None or b is None:
        return "-"
    if isinstance(a, bool) or isinstance(b, bool):
        return "" if a == b else "changed"
    d = b - a
    pct = f" ({100 * d / a:+.1f}%)" if a else ""
    if ns:
        return ("+" if d >= 0 else "-") + fmt_ns(abs(d)) + pct
    return (f"{d:+d}" if isinstance(d, int) else f"{d:+.3g}") + pct


def diff(a: Summary, b: Summary, a_name: str = "A", b_name: str = "B",
         time_tolerance: float = 0.10) -> TraceDiff:
    """Compares two summaries. Counts must match exactly to be 'same'; device times may
    differ by time_tolerance (relative, default 10%) since timings vary between runs."""
    out = TraceDiff(a_name, b_name)
    for name in ("ops", "executed", "events", "duration_ns", "host_ns", "device_ns",
                 "sync_count", "sync_wait_ns", "fallbacks", "segment_cuts", "segment_keys",
                 "bytes_per_op"):
        va, vb = getattr(a.totals, name), getattr(b.totals, name)
        out.totals.append(TotalChange(name, va, vb, _change(va, vb, name.endswith("_ns"))))
    ops_a = {o.name: o for o in a.ops}
    ops_b = {o.name: o for o in b.ops}
    for name in set(ops_a) | set(ops_b):
        oa, ob = ops_a.get(name), ops_b.get(name)
        ca, cb = (oa.calls if oa else 0), (ob.calls if ob else 0)
        da, db = (oa.device_total_ns if oa else 0), (ob.device_total_ns if ob else 0)
        same = ca == cb and (oa.executions if oa else 0) == (ob.executions if ob else 0) \
            and _rel(da, db, time_tolerance)
        out.ops.append(OpChange(
            name, _status(oa is not None, ob is not None, same), ca, cb, da, db,
            oa.device_avg_ns if oa else 0.0, ob.device_avg_ns if ob else 0.0,
            oa.host_total_ns if oa else 0, ob.host_total_ns if ob else 0))
    out.ops.sort(key=lambda o: (-abs(o.device_b - o.device_a), -abs(o.calls_b - o.calls_a),
                                o.name))
    seg_a = {g.key: g for g in a.segments}
    seg_b = {g.key: g for g in b.segments}
    for key in set(seg_a) | set(seg_b):
        ga, gb = seg_a.get(key), seg_b.get(key)
        g = ga or gb
        same = (ga is not None and gb is not None and ga.count == gb.count
                and ga.state == gb.state and ga.fused_count == gb.fused_count)
        out.segments.append(SegmentChange(
            g.key_hex, _status(ga is not None, gb is not None, same), g.length,
            ga.count if ga else 0, gb.count if gb else 0,
            ga.per_op_device_total_ns if ga else 0, gb.per_op_device_total_ns if gb else 0,
            ga.fused_total_ns if ga else 0, gb.fused_total_ns if gb else 0,
            ga.state if ga else "-", gb.state if gb else "-"))
    out.segments.sort(key=lambda g: (-abs(g.count_b - g.count_a),
                                     -abs(g.per_op_b + g.fused_b - g.per_op_a - g.fused_a),
                                     g.key_hex))
    sy_a = {y.cause: y for y in a.syncs}
    sy_b = {y.cause: y for y in b.syncs}
    for cause in set(sy_a) | set(sy_b):
        ya, yb = sy_a.get(cause), sy_b.get(cause)
        same = ya is not None and yb is not None and ya.count == yb.count
        out.syncs.append(SyncChange(
            cause, _status(ya is not None, yb is not None, same), ya.count if ya else 0,
            yb.count if yb else 0, ya.total_wait_ns if ya else 0,
            yb.total_wait_ns if yb else 0))
    out.syncs.sort(key=lambda y: (-abs(y.count_b - y.count_a), y.cause))
    return out
