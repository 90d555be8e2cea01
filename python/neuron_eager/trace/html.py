"""A self-contained HTML report of a trace: a zoomable timeline of every track's slices
(plus memory and queue counters) and the summary tables, in one file with inline JS/CSS
and the data embedded as JSON; it makes no network request."""

from __future__ import annotations

import html as _html
import json
import math
import os
from typing import Any, Dict, Optional

import numpy as np

from ._page import PAGE
from .format import KIND_NAMES, MEMORY, QUEUE_DEPTH, Trace
from .guard import basis_legend
from .summary import Summary, summarize
from .text import policy_label
from .tracks import build_tracks

DEFAULT_MAX_SLICES = 200_000
MAX_TABLE_ROWS = 500
MAX_COUNTER_POINTS = 20_000


def _clean(obj):
    """JSON-safe copy: no NaN/inf, numpy scalars as Python numbers."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, int) and not isinstance(obj, bool) and abs(obj) >= 2 ** 53:
        return float(obj)  # segment keys travel as key_hex; JS numbers are doubles
    return obj


def report_data(trace: Trace, summary: Optional[Summary] = None,
                max_slices: int = DEFAULT_MAX_SLICES) -> Dict[str, Any]:
    """The JSON the report page draws from."""
    summary = summary or summarize(trace)
    tracks = build_tracks(trace)
    total = sum(len(t) for t in tracks)
    ev = trace.events
    t0 = int(ev["time_ns"].min()) if len(ev) else 0
    t1 = int((ev["time_ns"] + ev["duration_ns"]).max()) if len(ev) else 1
    labels: Dict[str, int] = {}
    out_tracks = []
    shown = 0
    for t in tracks:
        # Over the limit, each track keeps its longest slices, in proportion to its size.
        budget = len(t) if total <= max_slices else max(1, max_slices * len(t) // total)
        if budget < len(t):
            sel = np.sort(np.argpartition(-t.dur, budget - 1)[:budget])
        else:
            sel = np.arange(len(t))
        shown += len(sel)
        lab = [labels.setdefault(x, len(labels)) for x in t.labels[sel].tolist()]
        out_tracks.append({
            "name": t.name, "tid": t.tid, "depth": int(t.depth[sel].max()) + 1,
            "s": (t.start[sel] - t0).tolist(), "d": t.dur[sel].tolist(), "l": lab,
            "k": ev["kind"][t.index[sel]].tolist(), "p": t.depth[sel].tolist()})
    counters = []
    kind = ev["kind"]
    for k, name, field in ((MEMORY, "memory neuron:{c}", "value"),
                           (QUEUE_DEPTH, "queue neuron:{c} stream {s}", "value")):
        sel = ev[kind == k]
        lanes = sorted(set(zip(sel["core"].tolist(), sel["stream"].tolist()))) if len(sel) else []
        if k == MEMORY:
            lanes = sorted({(c, 0) for c, _ in lanes})
        for c, s in lanes:
            m = sel["core"] == c if k == MEMORY else (sel["core"] == c) & (sel["stream"] == s)
            pts = sel[m]
            step = max(1, len(pts) // MAX_COUNTER_POINTS)
            pts = pts[::step]
            counters.append({"name": name.format(c=c, s=s),
                             "t": (pts["time_ns"].astype(np.int64) - t0).tolist(),
                             "v": pts[field].tolist()})
    sd = summary.to_dict()
    for key in ("ops", "segments", "fallbacks"):
        sd[key] = sd[key][:MAX_TABLE_ROWS]
    sd["guard"]["keys"] = sd["guard"]["keys"][:MAX_TABLE_ROWS]
    return _clean({
        "meta": trace.metadata, "policy_label": policy_label(trace.metadata.get("policy")),
        "speedup_legend": basis_legend(summary.guard.steady_warmup),
        "t0": t0, "t1": t1, "labels": list(labels),
        "kinds": KIND_NAMES, "tracks": out_tracks, "counters": counters,
        "total_slices": total, "shown_slices": shown, "summary": sd,
    })


def render(trace: Trace, summary: Optional[Summary] = None,
           max_slices: int = DEFAULT_MAX_SLICES, title: Optional[str] = None) -> str:
    """The report as one HTML string."""
    data = report_data(trace, summary, max_slices)
    if title is None:
        title = "neuron-eager trace" + (f": {os.path.basename(trace.path)}" if trace.path else "")
    payload = json.dumps(data, separators=(",", ":"), allow_nan=False)
    # "<" only occurs inside JSON strings, where \u003c is the same text and cannot end
    # the <script> element early (</script>, <!--).
    payload = payload.replace("<", "\\u003c")
    head, tail = PAGE.split("__DATA__")
    return head.replace("__TITLE__", _html.escape(title)) + payload + tail


def write(trace: Trace, path: str, summary: Optional[Summary] = None,
          max_slices: int = DEFAULT_MAX_SLICES) -> int:
    """Writes the report; returns its size in bytes."""
    text = render(trace, summary, max_slices)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return len(text.encode("utf-8"))
