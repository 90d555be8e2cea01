"""Timeline tracks of a trace: the slices (events with a duration) of each thread, laid out
so they nest. Shared by the Perfetto exporter and the HTML report.

Slices on one thread normally nest (a sync inside the dispatch that caused it) or follow
each other. One that starts inside another but ends after it cannot be drawn on the same
track as a proper stack, so it goes to an overflow lane, shown as a track of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

import numpy as np

from .format import (COLLECTIVE, COMPILE_END, OP_DISPATCH, OP_EXECUTE, SEGMENT_EXECUTE, SYNC, Trace)

SLICE_KINDS = (OP_DISPATCH, OP_EXECUTE, SYNC, SEGMENT_EXECUTE, COMPILE_END, COLLECTIVE)
COMPILER_TID = 100_000   # the "compiler" track (compilations run off the op threads)
COLLECTIVES_TID = 100_001  # the "collectives" track (the collective stream's calls)
LANE_TID_STRIDE = 1_000_000  # overflow lane n of thread t is tid t + n * stride


@dataclass
class Track:
    tid: int
    name: str
    sort: int                 # host threads, then workers, then others, then the compiler
    index: np.ndarray         # indices into trace.events, ordered by start
    start: np.ndarray         # ns
    dur: np.ndarray           # ns
    depth: np.ndarray         # nesting depth of each slice in this track
    labels: np.ndarray        # object array of slice names

    def __len__(self) -> int:
        return len(self.index)


def slice_labels(trace: Trace, idx: np.ndarray) -> np.ndarray:
    """Names of the slices at event indices idx, vectorised per kind."""
    ev = trace.events[idx]
    kind = ev["kind"]
    labels = np.empty(len(ev), dtype=object)
    ops = np.isin(kind, (OP_DISPATCH, OP_EXECUTE))
    if ops.any():
        labels[ops] = trace._lookup(trace.ops, ev["op"][ops], "op#{}", zero="(op)")
    sync = kind == SYNC
    if sync.any():
        causes = trace._lookup(trace.strings, ev["value"][sync], "string#{}", zero="?")
        labels[sync] = np.array(["sync: " + c for c in causes.tolist()], dtype=object)
    coll = np.nonzero(kind == COLLECTIVE)[0]
    for i in coll.tolist():
        e = ev[i]
        labels[i] = f"{trace.string(int(e['value']))} {_size(int(e['aux']))} [{trace.string(int(e['reserved']))}]"
    for k, prefix in ((SEGMENT_EXECUTE, "segment "), (COMPILE_END, "compile ")):
        sel = np.nonzero(kind == k)[0]
        for i, key in zip(sel.tolist(), ev["value"][sel].tolist()):
            labels[i] = f"{prefix}{key:016x}"
    return labels


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB"):
        if n < 1024 or unit == "MB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _thread_sort(name: str) -> int:
    low = name.lower()
    return 0 if low.startswith("host") else 1 if low.startswith("worker") else 2


def _nest(start: List[int], dur: List[int]):
    """Lane and depth of slices ordered by (start, longer first)."""
    stacks: List[List[int]] = [[]]  # per lane: end times of the open slices
    lanes, depths = [], []
    for s, d in zip(start, dur):
        e = s + d
        for lane, stack in enumerate(stacks):
            while stack and stack[-1] <= s:
                stack.pop()
            if not stack or e <= stack[-1]:
                break
        else:
            stacks.append([])
            lane = len(stacks) - 1
            stack = stacks[lane]
        lanes.append(lane)
        depths.append(len(stack))
        stack.append(e)
    return np.array(lanes, dtype=np.int64), np.array(depths, dtype=np.int64)


def build_tracks(trace: Trace) -> List[Track]:
    ev = trace.events
    idx = np.nonzero(np.isin(ev["kind"], SLICE_KINDS))[0]
    if len(idx) == 0:
        return []
    tid = ev["thread"][idx].astype(np.int64)
    tid[ev["kind"][idx] == COMPILE_END] = COMPILER_TID
    tid[ev["kind"][idx] == COLLECTIVE] = COLLECTIVES_TID
    start = ev["time_ns"][idx].astype(np.int64)
    dur = ev["duration_ns"][idx].astype(np.int64)
    order = np.lexsort((-dur, start, tid))
    idx, tid, start, dur = idx[order], tid[order], start[order], dur[order]
    labels = slice_labels(trace, idx)
    tracks = []
    bounds = np.flatnonzero(np.diff(tid)) + 1
    for lo, hi in zip(np.concatenate([[0], bounds]), np.concatenate([bounds, [len(tid)]])):
        t = int(tid[lo])
        lanes, depth = _nest(start[lo:hi].tolist(), dur[lo:hi].tolist())
        if t == COMPILER_TID:
            name, sort = "compiler", 3
        elif t == COLLECTIVES_TID:
            name, sort = "collectives", 2
        else:
            name = trace.thread_name(t)
            sort = _thread_sort(name)
        for lane in np.unique(lanes).tolist():
            sel = np.nonzero(lanes == lane)[0] + lo
            tracks.append(Track(
                tid=t + lane * LANE_TID_STRIDE, name=name if lane == 0 else f"{name} ({lane + 1})",
                sort=sort, index=idx[sel], start=start[sel], dur=dur[sel],
                depth=depth[lanes == lane], labels=labels[sel]))
    tracks.sort(key=lambda tr: (tr.sort, tr.tid % LANE_TID_STRIDE, tr.tid))
    return tracks
