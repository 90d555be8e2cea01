"""Chrome Trace Event JSON of a trace, for ui.perfetto.dev or chrome://tracing.

One process (pid from the metadata) with named tracks: each host thread, each stream worker
and a "compiler" track. Complete ("X") slices for dispatches, executions, syncs, fused
segments and compilations; flow arrows from each op's dispatch to its execution; counter
("C") events for memory and queue depth; instant ("i") events, each with args.reason, for
key misses, fallbacks, the online guard's verdicts and segment state transitions. Times
are microseconds (floats) as the format requires.

The JSON text is generated event by event from numpy columns (no per-event dicts), so
millions of ops export in seconds; the file is ~200 bytes per event.
"""

from __future__ import annotations

import json
from typing import Any, Dict, Iterator, List

import numpy as np

from .format import (COLLECTIVE, COMPILE_END, FALLBACK, GUARD_VERDICT, GUARD_VERDICTS, KEY_MISS, MEMORY,
                     OP_DISPATCH, OP_EXECUTE, QUEUE_DEPTH, SEGMENT_EXECUTE, SEGMENT_STATE,
                     SYNC, Trace, transition_name)
from .tracks import Track, build_tracks

CATEGORIES = {OP_DISPATCH: "dispatch", OP_EXECUTE: "execute", SYNC: "sync",
              SEGMENT_EXECUTE: "segment", COMPILE_END: "compile", COLLECTIVE: "collective"}


def _pid(meta: Dict[str, Any]) -> int:
    try:
        return int(meta.get("pid", 1))
    except (TypeError, ValueError):
        return 1


class _Text:
    """JSON string literals, cached: op names and causes repeat millions of times."""

    def __init__(self, trace: Trace):
        self.trace = trace
        self.cache: Dict[Any, str] = {}

    def __call__(self, s: str) -> str:
        out = self.cache.get(s)
        if out is None:
            out = self.cache[s] = json.dumps(s)
        return out

    def string(self, sid: int) -> str:
        return self(self.trace.string(sid))

    def op(self, oid: int) -> str:
        return self(self.trace.op_name(oid))


def _slices(trace: Trace, tracks: List[Track], text: _Text, pid: int) -> Iterator[str]:
    ev = trace.events
    for n, tr in enumerate(tracks):
        name = text(tr.name)
        yield (f'{{"ph":"M","pid":{pid},"tid":{tr.tid},"name":"thread_name",'
               f'"args":{{"name":{name}}}}}')
        yield (f'{{"ph":"M","pid":{pid},"tid":{tr.tid},"name":"thread_sort_index",'
               f'"args":{{"sort_index":{n}}}}}')
        rows = ev[tr.index]
        kind, seq, val, aux = (rows[f].tolist() for f in ("kind", "seq", "value", "aux"))
        core, stream = rows["core"].tolist(), rows["stream"].tolist()
        ts, dur = (tr.start / 1000.0).tolist(), (tr.dur / 1000.0).tolist()
        head = f'{{"ph":"X","pid":{pid},"tid":{tr.tid},"ts":'
        for i, label in enumerate(tr.labels.tolist()):
            k = kind[i]
            if k == OP_DISPATCH:
                args = f'{{"seq":{seq[i]},"signature":"{val[i]:016x}"}}'
            elif k == OP_EXECUTE:
                args = f'{{"seq":{seq[i]},"core":{core[i]},"stream":{stream[i]}}}'
            elif k == SYNC:
                stack = f',"stack":{text.string(aux[i])}' if aux[i] else ""
                args = f'{{"cause":{text.string(val[i])}{stack}}}'
            elif k == COLLECTIVE:
                args = (f'{{"call":{text.string(val[i])},"bytes":{aux[i]},"number":{seq[i]},'
                        f'"group":{text.string(int(rows["reserved"][i]))},"core":{core[i]}}}')
            elif k == SEGMENT_EXECUTE:
                args = (f'{{"key":"{val[i]:016x}","ops":{aux[i]},"core":{core[i]},'
                        f'"stream":{stream[i]}}}')
            else:
                args = f'{{"key":"{val[i]:016x}","tier":{aux[i]}}}'
            yield (f'{head}{ts[i]!r},"dur":{dur[i]!r},"name":{text(label)},'
                   f'"cat":"{CATEGORIES[k]}","args":{args}}}')


def _flows(trace: Trace, pid: int, tid_of: np.ndarray) -> Iterator[str]:
    """Dispatch -> execute arrows for the seqs that have both."""
    ev = trace.events
    kind = ev["kind"]
    d_idx = np.nonzero(kind == OP_DISPATCH)[0]
    x_idx = np.nonzero(kind == OP_EXECUTE)[0]
    common, d_pos, x_pos = np.intersect1d(ev["seq"][d_idx], ev["seq"][x_idx],
                                          return_indices=True)
    di, xi = d_idx[d_pos], x_idx[x_pos]
    d_ts = (ev["time_ns"][di] / 1000.0).tolist()
    x_ts = (ev["time_ns"][xi] / 1000.0).tolist()
    for seq, a, b, ta, tb in zip(common.tolist(), tid_of[di].tolist(), tid_of[xi].tolist(),
                                 d_ts, x_ts):
        yield (f'{{"ph":"s","id":{seq},"pid":{pid},"tid":{a},"ts":{ta!r},'
               f'"name":"op","cat":"flow"}}')
        yield (f'{{"ph":"f","bp":"e","id":{seq},"pid":{pid},"tid":{b},"ts":{tb!r},'
               f'"name":"op","cat":"flow"}}')


def _others(trace: Trace, text: _Text, pid: int, named: set) -> Iterator[str]:
    ev = trace.events
    kind = ev["kind"]
    for e in ev[kind == MEMORY].tolist():  # tuples in EVENT_DTYPE field order
        yield (f'{{"ph":"C","pid":{pid},"name":"memory neuron:{e[8]}","ts":{e[0] / 1000.0!r},'
               f'"args":{{"allocated":{e[3]},"reserved":{e[4]}}}}}')
    for e in ev[kind == QUEUE_DEPTH].tolist():
        yield (f'{{"ph":"C","pid":{pid},"name":"queue neuron:{e[8]} stream {e[9]}",'
               f'"ts":{e[0] / 1000.0!r},"args":{{"pending":{e[3]}}}}}')
    tids = set()
    for e in ev[kind == KEY_MISS].tolist():
        tids.add(e[6])
        yield (f'{{"ph":"i","s":"t","pid":{pid},"tid":{e[6]},"ts":{e[0] / 1000.0!r},'
               f'"name":"key miss","cat":"segment","args":{{"key":"{e[3]:016x}",'
               f'"reason":"first sight of this segment key"}}}}')
    for e in ev[kind == FALLBACK].tolist():
        tids.add(e[6])
        op = text.op(e[5])
        yield (f'{{"ph":"i","s":"t","pid":{pid},"tid":{e[6]},"ts":{e[0] / 1000.0!r},'
               f'"name":{text("fallback: " + trace.op_name(e[5]))},"cat":"fallback",'
               f'"args":{{"op":{op},"reason":{text.string(e[3])}}}}}')
    for e in ev[kind == GUARD_VERDICT].tolist():
        tids.add(e[6])
        verdict = GUARD_VERDICTS.get(e[10], f"verdict {e[10]}")
        ratio = f"{e[4] / e[2]:.3f}" if e[2] else "?"
        yield (f'{{"ph":"i","s":"t","pid":{pid},"tid":{e[6]},"ts":{e[0] / 1000.0!r},'
               f'"name":"guard: {verdict}","cat":"guard","args":{{"key":"{e[3]:016x}",'
               f'"reason":"fused/per-op period {ratio} over {e[5]} samples, trial {e[11]}",'
               f'"verdict":"{verdict}","fused_period_ns":{e[4]},"per_op_period_ns":{e[2]},'
               f'"samples":{e[5]},"trial":{e[11]}}}}}')
    for e in ev[kind == SEGMENT_STATE].tolist():
        tids.add(e[6])
        yield (f'{{"ph":"i","s":"t","pid":{pid},"tid":{e[6]},"ts":{e[0] / 1000.0!r},'
               f'"name":"state: {transition_name(e[10])}","cat":"segment",'
               f'"args":{{"key":"{e[3]:016x}","occurrences":{e[4]},'
               f'"reason":"state transition after {e[4]} occurrences"}}}}')
    for tid in sorted(tids - named):  # threads with instants but no slices
        yield (f'{{"ph":"M","pid":{pid},"tid":{tid},"name":"thread_name",'
               f'"args":{{"name":{text(trace.thread_name(tid))}}}}}')


def iter_json(trace: Trace) -> Iterator[str]:
    """The Chrome Trace JSON text, in pieces."""
    meta = trace.metadata
    pid = _pid(meta)
    text = _Text(trace)
    other = {"format_version": trace.version, "complete": trace.complete}
    other.update({k: v for k, v in meta.items() if isinstance(v, (str, int, float, bool))})
    yield ('{"displayTimeUnit":"ns","otherData":' + json.dumps(other) + ',"traceEvents":[\n'
           f'{{"ph":"M","pid":{pid},"tid":0,"name":"process_name","args":{{"name":'
           f'{text("neuron-eager (" + str(meta.get("mode", "?")) + " mode)")}}}}}')
    tracks = build_tracks(trace)
    tid_of = np.zeros(len(trace.events), dtype=np.int64)  # track of each slice event
    for tr in tracks:
        tid_of[tr.index] = tr.tid
    batch: List[str] = []
    for part in (_slices(trace, tracks, text, pid), _flows(trace, pid, tid_of),
                 _others(trace, text, pid, {t.tid for t in tracks})):
        for piece in part:
            batch.append(piece)
            if len(batch) >= 65536:
                yield ",\n" + ",\n".join(batch)
                batch.clear()
    if batch:
        yield ",\n" + ",\n".join(batch)
    yield "\n]}\n"


def chrome_trace(trace: Trace) -> Dict[str, Any]:
    """The trace as a Chrome Trace Event JSON object (parsed; for small traces and tests)."""
    return json.loads("".join(iter_json(trace)))


def write(trace: Trace, path: str) -> int:
    """Writes the Chrome Trace JSON to path; returns the number of trace events."""
    count = 0
    with open(path, "w", encoding="utf-8") as f:
        for piece in iter_json(trace):
            f.write(piece)
            count += piece.count('\n{"ph":')
    return count
