"""Text, tables and plots of replay results: `neuron-trace replay` (one policy, --compare,
--sweep)."""

from __future__ import annotations

import csv
import json
import os
import sys
from typing import Any, Dict, List, Sequence

from .replay import Prepared, ReplayReport, as_policy, prepare, replay, sweep


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.3f}"


def format_report(r: ReplayReport, prepared: Prepared, top: int = 20) -> str:
    t = prepared.trace
    lines = [
        f"trace      {t.path or '<memory>'}: {prepared.ops} ops, "
        f"{prepared.core.recorded_segments} recorded segments, recorded under "
        f"{(t.metadata.get('policy') or {}).get('name', '?')!r} in {t.metadata.get('mode', '?')} mode",
        f"policy     {r.policy['name']!r}  (cost model: {r.cost_model})",
        f"predicted device time  {_ms(r.device_ns)} ms  (per-op {_ms(r.per_op_ns)} ms, "
        f"fused {_ms(r.fused_ns)} ms)",
        f"compiles   {r.compiles} (compile time {_ms(r.compile_ns)} ms"
        + (f"; native builds {r.native_compiles}" if r.native_compiles else "") + ")",
        f"hit rate   {r.hit_rate:.1%} of ops ran fused ({r.ops_fused}/{r.ops}); "
        f"{r.segment_hit_rate:.1%} of segment occurrences ({r.occurrences_fused}/{r.occurrences})",
        f"fidelity   {r.matched_segments} cuts coincide with recorded ones; recomputed keys "
        f"differed at {r.key_mismatches} of them" + (
            f"; fused/per-op ratio {r.fused_ratio:.3f}" if r.cost_model == "measured" else ""),
        f"replay     {r.replay_s * 1e3:.1f} ms ({r.ops / max(r.replay_s, 1e-9) / 1e6:.2f} M ops/s); "
        f"prepare {prepared.prepare_s * 1e3:.1f} ms",
        "",
        f"segments ({min(top, len(r.keys))} of {len(r.keys)}, most predicted time first)",
        f"{'key':>16s} {'len':>5s} {'occ':>6s} {'fused':>6s} {'built@':>6s} {'per-op us':>10s} "
        f"{'fused us':>9s} {'total ms':>9s}  {'decision':20s} first op",
    ]
    for k in sorted(r.keys, key=lambda k: -k.predicted_ns)[:top]:
        lines.append(
            f"{k.key:016x} {k.length:5d} {k.occurrences:6d} {k.fused:6d} "
            f"{k.compiled_at if k.compiled_at >= 0 else '-':>6} {k.per_op_ns / 1e3:10.1f} "
            f"{k.fused_ns / 1e3:9.1f} {k.predicted_ns / 1e6:9.3f}  "
            f"{k.decision + (' +native' if k.native else ''):20s} {k.first_op}")
    return "\n".join(lines) + "\n"


COLUMNS = ("policy", "device_ms", "per_op_ms", "fused_ms", "compiles", "compile_ms",
           "hit_rate", "segment_hit_rate", "keys")


def row(label: str, r: ReplayReport) -> Dict[str, Any]:
    return {"policy": label, "device_ms": r.device_ns / 1e6, "per_op_ms": r.per_op_ns / 1e6,
            "fused_ms": r.fused_ns / 1e6, "compiles": r.compiles,
            "compile_ms": r.compile_ns / 1e6, "hit_rate": r.hit_rate,
            "segment_hit_rate": r.segment_hit_rate, "keys": len(r.keys)}


def format_table(rows: List[Dict[str, Any]], first: str = "policy") -> str:
    head = f"{first:>24s} {'device ms':>10s} {'per-op ms':>10s} {'fused ms':>9s} " \
           f"{'compiles':>8s} {'compile ms':>10s} {'hit rate':>8s} {'seg hits':>8s} {'keys':>6s}"
    lines = [head]
    for r in rows:
        lines.append(f"{str(r[first]):>24s} {r['device_ms']:10.3f} {r['per_op_ms']:10.3f} "
                     f"{r['fused_ms']:9.3f} {r['compiles']:8d} {r['compile_ms']:10.3f} "
                     f"{r['hit_rate']:8.1%} {r['segment_hit_rate']:8.1%} {r['keys']:6d}")
    return "\n".join(lines) + "\n"


def write_sweep(rows: List[Dict[str, Any]], knob: str, prefix: str, title: str) -> List[str]:
    """PREFIX.csv (the table) and PREFIX.png (predicted time and compiles against the knob)."""
    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    with open(prefix + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[knob] + [c for c in COLUMNS if c != "policy"])
        w.writeheader()
        for r in rows:
            w.writerow({knob: r[knob], **{c: r[c] for c in COLUMNS if c != "policy"}})
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    xs = [r[knob] for r in rows]
    numeric = all(isinstance(x, (int, float)) for x in xs)
    pos = xs if numeric else list(range(len(xs)))
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(pos, [r["device_ms"] for r in rows], "o-", color="tab:blue", label="predicted device time")
    ax.set_xlabel(knob)
    ax.set_ylabel("predicted device time (ms)", color="tab:blue")
    if not numeric:
        ax.set_xticks(pos, [str(x) for x in xs])
    elif len(xs) > 2 and min(xs) > 0 and max(xs) / min(xs) >= 50:
        ax.set_xscale("log")
    ax2 = ax.twinx()
    ax2.plot(pos, [r["compiles"] for r in rows], "s--", color="tab:orange", label="compiles")
    ax2.set_ylabel("compiles", color="tab:orange")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(prefix + ".png", dpi=110)
    plt.close(fig)
    return [prefix + ".csv", prefix + ".png"]


def _parse_value(text: str) -> Any:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def run(args) -> int:
    prepared = prepare(args.trace, allow_incomplete=args.allow_incomplete)
    out = sys.stdout
    if args.sweep:
        knob, _, values = args.sweep.partition("=")
        if not knob or not values:
            raise ValueError("neuron: --sweep expects knob=a,b,c")
        xs = [_parse_value(v.strip()) for v in values.split(",") if v.strip()]
        reports = sweep(prepared, args.policy, knob.strip(), xs, args.cost_model)
        rows = [{knob: x, **row(f"{knob}={x}", r)} for x, r in zip(xs, reports)]
        out.write(format_table(rows))
        prefix = args.output or f"sweep-{knob}"
        title = (f"{os.path.basename(args.trace)}: {args.policy} with {knob} swept "
                 f"({args.cost_model} cost model)")
        for path in write_sweep(rows, knob, prefix, title):
            out.write(f"wrote {path}\n")
        return 0
    if args.compare:
        rows = [row(p, replay(prepared, p, args.cost_model)) for p in args.compare]
        if args.json:
            json.dump(rows, out, indent=1)
            out.write("\n")
        else:
            out.write(format_table(rows))
        return 0
    r = replay(prepared, args.policy, args.cost_model)
    if args.json:
        json.dump(r.to_dict(), out, indent=1, default=str)
        out.write("\n")
    else:
        out.write(format_report(r, prepared, top=args.top))
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser(
        "replay", help="what a fusion policy would do on this trace, and what it would cost",
        description="Re-runs segmenting, hotness, the cost gate and tier choice over the "
        "recorded op stream under a policy, without executing anything, and predicts "
        "device time with a cost model (docs/heuristics.md).")
    p.add_argument("trace", help="trace file")
    p.add_argument("--policy", default="default",
                   help="built-in name (default, aggressive, conservative, never), a policy "
                        "file, FILE.py:Name for a Python Policy, or 'recorded' (default: default)")
    p.add_argument("--compare", nargs="+", metavar="P", help="replay each policy; print a table")
    p.add_argument("--sweep", metavar="KNOB=A,B,C",
                   help="replay --policy with KNOB at each value; write PREFIX.csv and PREFIX.png")
    p.add_argument("-o", "--output", help="prefix of the sweep's files (default sweep-KNOB)")
    p.add_argument("--cost-model", choices=COST_MODELS_CHOICES, default="measured",
                   help="measured: timings in the trace; trn2: analytical Trainium2 NeuronCore")
    p.add_argument("--top", type=int, default=20, help="segments listed (default 20)")
    p.add_argument("--json", action="store_true", help="print the result as JSON data")
    p.add_argument("--allow-incomplete", action="store_true",
                   help="read a trace that was not closed up to its last whole chunk")


COST_MODELS_CHOICES = ("measured", "trn2")
