"""Plain-text tables of trace summaries and diffs (what `neuron-trace summary/diff` print)."""

from __future__ import annotations

import functools
import json
from typing import Any, Dict, List, Optional, Sequence

from .guard import SPEEDUP_HEAD, basis_items
from .summary import Summary


def fmt_ns(ns: Optional[float]) -> str:
    """A duration with a readable unit: 850 ns, 12.30 us, 1.234 ms, 2.500 s."""
    if ns is None:
        return "-"
    ns = float(ns)
    if abs(ns) < 1e3:
        return f"{ns:.0f} ns"
    if abs(ns) < 1e6:
        return f"{ns / 1e3:.2f} us"
    if abs(ns) < 1e9:
        return f"{ns / 1e6:.3f} ms"
    return f"{ns / 1e9:.3f} s"


def fmt_bytes(n: Optional[float]) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def fmt_pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def table(headers: Sequence[str], rows: List[Sequence], title: str = "",
          left: int = 1) -> str:
    """A text table; the first `left` columns are left-aligned, the rest right-aligned."""
    cells = [[str(c) for c in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r):
        return "  ".join(c.ljust(w) if i < left else c.rjust(w)
                         for i, (c, w) in enumerate(zip(r, widths))).rstrip()

    out = [title] if title else []
    out += [line(cells[0]), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in cells[1:]] or ["(none)"]
    return "\n".join(out)


@functools.lru_cache(maxsize=16)
def _builtin_knobs(name: str) -> Optional[Dict[str, Any]]:
    """Every knob of a built-in policy (default when `name` is none), from the engine; None
    without its bindings."""
    try:
        from neuron_eager import _C
        base = name if name in ("default", "aggressive", "conservative", "never") else "default"
        return json.loads(_C._replay_policy(base, []))
    except Exception:  # no bindings (a viewer-only install) or an older engine
        return None


def _knob(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(str(v) for v in value) or "[]"
    return str(value)


def policy_label(policy: Any) -> str:
    """The recorded policy in one readable line: its name and the knobs that differ from
    the built-in policy of that name (from default for other names), e.g. 'default
    (hot_threshold=5, guard=false)'; every knob when the engine's defaults are unknown."""
    if policy is None:
        return "?"
    if not isinstance(policy, dict):
        return str(policy)
    name = str(policy.get("name", "custom"))
    ref = _builtin_knobs(name)
    knobs = [f"{k}={_knob(v)}" for k, v in policy.items()
             if k != "name" and (ref is None or k not in ref or ref[k] != v)]
    return f"{name} ({', '.join(knobs)})" if knobs else name


def speedup_text(g) -> str:
    """A segment's speedup with the first letter of its basis: 1.25x g, 0.90x s, 3.10x a."""
    return f"{g.speedup:.2f}x {g.speedup_basis[:1]}".rstrip() if g.speedup else "-"


def _more(n: int, shown: int) -> str:
    return f"... {n - shown} more" if n > shown else ""


def format_summary(s: Summary, top: int = 20) -> str:
    t = s.totals
    meta = s.metadata
    policy = policy_label(meta.get("policy"))
    engine = meta.get("engine_version", meta.get("engine", "?"))
    torch_version = meta.get("torch_version", meta.get("torch", "?"))
    head = [
        f"neuron-eager trace: mode={meta.get('mode', '?')} policy={policy} engine={engine} "
        f"torch={torch_version} cores={meta.get('cores', '?')}",
        f"{t.ops} ops dispatched, {t.executed} executed, {t.events} events over "
        f"{fmt_ns(t.duration_ns)}; host {fmt_ns(t.host_ns)}, device {fmt_ns(t.device_ns)}, "
        f"sync wait {fmt_ns(t.sync_wait_ns)} in {t.sync_count} syncs, {t.fallbacks} fallbacks",
    ]
    if t.file_bytes is not None:
        head.append(f"file {fmt_bytes(t.file_bytes)}"
                    + (f", {t.bytes_per_op:.1f} bytes/op, {t.events_per_op:.2f} events/op"
                       if t.bytes_per_op else ""))
    if not t.complete:
        head.append("WARNING: the trace was not closed; showing what it holds")
    d = s.device
    head.append(f"device time: per-op {fmt_ns(d.per_op_ns)}, fused {fmt_ns(d.fused_ns)} "
                f"({fmt_pct(d.fused_share)} fused), compile {fmt_ns(d.compile_ns)}")
    parts = ["\n".join(head)]
    parts.append(table(
        ["op", "calls", "host total", "host avg", "device total", "device avg", "device %",
         "fallbacks"],
        [[o.name, o.calls, fmt_ns(o.host_total_ns), fmt_ns(o.host_avg_ns),
          fmt_ns(o.device_total_ns), fmt_ns(o.device_avg_ns), fmt_pct(o.device_share),
          o.fallbacks] for o in s.ops[:top]],
        title=f"Top ops by device time ({len(s.ops)} distinct)"))
    parts.append(_more(len(s.ops), top))
    parts.append(table(
        ["key", "state", "length", "count", "hits", "per-op total", "per-op avg",
         "fused count", "fused avg", "speedup", "compile", "cut reasons", "first ops"],
        [[g.key_hex, g.state, g.length, g.count, g.hits, fmt_ns(g.per_op_device_total_ns),
          fmt_ns(g.per_op_device_avg_ns), g.fused_count,
          fmt_ns(g.fused_avg_ns) if g.fused_count else "-",
          speedup_text(g),
          fmt_ns(g.compile_ns) if g.compiles else "-",
          ",".join(f"{k}:{v}" for k, v in g.cut_reasons.items()) or "-",
          " ".join(g.first_ops[:4]) + (" ..." if g.length > 4 else "")]
         for g in s.segments[:top]],
        title=f"Segments ({len(s.segments)} keys)", left=2))
    parts.append("\n".join(filter(None, [
        _more(len(s.segments), top),
        "\n  ".join([SPEEDUP_HEAD] + basis_items(s.guard.steady_warmup))])))
    if s.guard.present:
        parts.append(format_guard(s, top))
    parts.append(table(
        ["cause", "count", "total wait", "avg wait", "max wait", "first stack"],
        [[y.cause, y.count, fmt_ns(y.total_wait_ns), fmt_ns(y.avg_wait_ns),
          fmt_ns(y.max_wait_ns), (y.stack.strip().splitlines() or ["-"])[-1][:60]]
         for y in s.syncs],
        title="Syncs by cause"))
    if s.collectives:
        parts.append(table(
            ["call", "group", "count", "bytes", "total", "avg", "max"],
            [[c.call, c.group, c.count, fmt_bytes(c.total_bytes), fmt_ns(c.total_ns), fmt_ns(c.avg_ns),
              fmt_ns(c.max_ns)] for c in s.collectives[:top]],
            title="Collectives (time on the collective stream)", left=2))
    if s.fallbacks:
        parts.append(table(["op", "reason", "count"],
                           [[f.op, f.reason, f.count] for f in s.fallbacks[:top]],
                           title="Fallbacks (ops run synchronously)", left=2))
    if s.memory or s.queues:
        rows = [[f"neuron:{m.core}", "memory", f"peak {fmt_bytes(m.peak_allocated)} allocated",
                 f"peak {fmt_bytes(m.peak_reserved)} reserved", m.samples] for m in s.memory]
        rows += [[f"neuron:{q.core} stream {q.stream}", "queue", f"max {q.max_depth}",
                  f"avg {q.avg_depth:.1f}", q.samples] for q in s.queues]
        parts.append(table(["where", "counter", "peak", "", "samples"], rows,
                           title="Counters", left=2))
    return "\n\n".join(p for p in parts if p) + "\n"


def format_guard(s: Summary, top: int = 20) -> str:
    """The online guard's verdicts per key, and its totals."""
    g = s.guard
    states = ", ".join(f"{n} {k}" for k, n in sorted(g.states.items()))
    head = (f"Guard: {g.verdicts} verdicts on {sum(1 for k in g.keys if k.verdicts)} keys: "
            f"{g.kept} kept, {g.demotions} demotions ({g.undecided} undecided), "
            f"{g.retrials} re-trials; {g.transitions} state transitions"
            + (f"; current states: {states}" if states else ""))
    rows = [[k.key_hex, k.state or "-", k.verdict or "-",
             f"{k.ratio:.3f}" if k.ratio else "-", f"{k.speedup:.2f}x" if k.speedup else "-",
             fmt_ns(k.fused_period_ns) if k.verdicts else "-",
             fmt_ns(k.per_op_period_ns) if k.verdicts else "-", k.samples, k.retrials,
             k.demotions, " ".join(k.history) or "-"] for k in g.keys[:top]]
    out = table(["key", "state", "verdict", "fused/per-op", "speedup", "fused period",
                 "per-op period", "samples", "re-trials", "demotions", "verdicts"], rows,
                title=head, left=3)
    more = _more(len(g.keys), top)
    return out + ("\n" + more if more else "")


def format_diff(d, top: int = 30) -> str:
    """Text of a diff.TraceDiff."""
    def val(name, v):
        if v is None:
            return "-"
        if name.endswith("_ns"):
            return fmt_ns(v)
        return f"{v:.1f}" if isinstance(v, float) else str(v)

    parts = [table(["total", "A", "B", "change"],
                   [[c.name, val(c.name, c.a), val(c.name, c.b), c.change] for c in d.totals],
                   title=f"Totals: A={d.a_name}  B={d.b_name}")]
    changed = [o for o in d.ops if o.status != "same"]
    parts.append(table(
        ["op", "status", "calls A", "calls B", "device A", "device B", "device change",
         "avg A", "avg B"],
        [[o.name, o.status, o.calls_a, o.calls_b, fmt_ns(o.device_a), fmt_ns(o.device_b),
          fmt_ns(o.device_b - o.device_a), fmt_ns(o.avg_a), fmt_ns(o.avg_b)]
         for o in changed[:top]],
        title=f"Ops ({len(changed)} changed of {len(d.ops)}; by size of the change)", left=2))
    parts.append(_more(len(changed), top))
    seg = [g for g in d.segments if g.status != "same"]
    parts.append(table(
        ["key", "status", "state", "length", "count A", "count B", "per-op A", "per-op B",
         "fused A", "fused B"],
        [[g.key_hex, g.status, f"{g.state_a} -> {g.state_b}", g.length, g.count_a, g.count_b,
          fmt_ns(g.per_op_a), fmt_ns(g.per_op_b), fmt_ns(g.fused_a), fmt_ns(g.fused_b)]
         for g in seg[:top]],
        title=f"Segments ({len(seg)} changed of {len(d.segments)})", left=3))
    parts.append(_more(len(seg), top))
    parts.append(table(
        ["cause", "status", "count A", "count B", "wait A", "wait B"],
        [[y.cause, y.status, y.count_a, y.count_b, fmt_ns(y.wait_a), fmt_ns(y.wait_b)]
         for y in d.syncs],
        title="Syncs by cause", left=2))
    return "\n\n".join(p for p in parts if p) + "\n"
