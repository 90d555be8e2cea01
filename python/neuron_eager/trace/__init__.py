"""Recording and reading neuron-eager trace files.

    import neuron_eager.trace as nt
    with nt.record("run.ntrace") as rec:
        model(x)
    print(rec.stats)                 # events, bytes, bytes per op
    tr = nt.load("run.ntrace")       # metadata, ops, strings, threads, events (numpy)
    s = nt.summarize(tr)             # top ops, segments, syncs, device time: as data

The `neuron-trace` command (neuron_eager.trace.cli) prints summaries and writes Perfetto
JSON and self-contained HTML reports. The file format is described in docs/trace-format.md.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import sys
import time
from dataclasses import dataclass
from typing import Any, Dict, Optional

from .format import (CUT_REASONS, EVENT_DTYPE, FORMAT_VERSION, KIND_NAMES, Trace,
                     TraceFormatError, load, parse)
from .summary import Summary, summarize

__all__ = ["record", "start", "stop", "active", "load", "parse", "summarize", "Trace",
           "TraceStats", "Recording", "Summary", "TraceFormatError", "EVENT_DTYPE",
           "KIND_NAMES", "CUT_REASONS", "FORMAT_VERSION"]


@dataclass
class TraceStats:
    """What stop() reports: events and bytes written, and ops dispatched while recording."""

    path: str
    events: int
    bytes: int
    ops: int

    @property
    def bytes_per_op(self) -> float:
        return self.bytes / self.ops if self.ops else 0.0

    @property
    def events_per_op(self) -> float:
        return self.events / self.ops if self.ops else 0.0

    def __str__(self) -> str:
        return (f"trace {self.path}: {self.events} events, {self.bytes} bytes, {self.ops} ops, "
                f"{self.bytes_per_op:.1f} bytes/op")


@dataclass
class Recording:
    """The handle record()/start() return; `stats` is set once the recording stops."""

    path: str
    stats: Optional[TraceStats] = None


_state: Dict[str, Any] = {}


def _native():
    """The C++ recorder's bindings, or a clear error when this build lacks them."""
    from .. import _C

    missing = [n for n in ("trace_start", "trace_stop", "trace_active") if not hasattr(_C, n)]
    if missing:
        raise RuntimeError(
            "neuron_eager.trace: this build of neuron_eager._C has no trace recorder "
            f"(missing {', '.join(missing)}); rebuild neuron-eager with the trace bindings. "
            "Reading existing traces (load, summarize, neuron-trace) works without them.")
    return _C


def _ops_dispatched() -> int:
    from .. import _C

    try:
        return int(_C.counters().get("ops_dispatched", 0))
    except Exception:  # counters are informative only
        return 0


def _metadata(extra: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    import neuron_eager

    # The engine writes its own part of the metadata (mode, policy, engine and torch
    # versions, cores, pid); this is what only the Python side knows.
    meta: Dict[str, Any] = {
        "python_version": platform.python_version(),
        "launch_blocking": neuron_eager.launch_blocking(),
        "host": platform.node(),
        "argv": list(sys.argv),
        "started_at": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "env": {k: v for k, v in os.environ.items() if k.startswith("NEURON_")},
    }
    meta.update(extra or {})
    return meta


def _drain(native, timeout_s: float = 120.0) -> None:
    """Waits for every core's queued work by polling pending_work, which (unlike
    synchronize) leaves no Sync event of its own in the trace."""
    deadline = time.monotonic() + timeout_s
    cores = range(native.device_count())
    while any(native.pending_work(i) for i in cores):
        if time.monotonic() > deadline:
            for i in cores:
                native.synchronize(i)
            return
        time.sleep(0.0005)


def active() -> bool:
    """Whether a trace is being recorded."""
    return bool(_native().trace_active())


def start(path, metadata: Optional[Dict[str, Any]] = None) -> Recording:
    """Starts recording to path. metadata (JSON-serialisable) is stored in the file's
    metadata chunk next to the engine's own (mode, policy, versions, cores) and Python's
    (python version, argv, host, start time, NEURON_* variables). Raises RuntimeError if
    a recording is running."""
    native = _native()
    path = os.fspath(path)
    meta_json = json.dumps(_metadata(metadata), default=str)
    native.trace_start(path, meta_json)
    rec = Recording(path)
    _state.update(recording=rec, ops_at_start=_ops_dispatched())
    return rec


def stop(synchronize: bool = True) -> TraceStats:
    """Stops recording and closes the file. With synchronize (default) all cores finish
    their queued work first, so every dispatched op's execution is in the trace (this
    wait polls the queues and records no Sync event)."""
    native = _native()
    if not native.trace_active():
        raise RuntimeError("neuron_eager.trace.stop(): no trace is being recorded")
    if synchronize:
        _drain(native)
    events, nbytes = native.trace_stop()
    rec: Optional[Recording] = _state.pop("recording", None)
    ops = max(0, _ops_dispatched() - _state.pop("ops_at_start", 0))
    stats = TraceStats(rec.path if rec else "", int(events), int(nbytes), ops)
    if rec is not None:
        rec.stats = stats
    return stats


@contextlib.contextmanager
def record(path, metadata: Optional[Dict[str, Any]] = None, synchronize: bool = True):
    """Records a trace of the block to path; the yielded Recording has `.stats` after it."""
    rec = start(path, metadata)
    try:
        yield rec
    finally:
        stop(synchronize=synchronize)
