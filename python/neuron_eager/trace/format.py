"""Reader of neuron-eager trace files (format v1, see docs/trace-format.md).

The whole file is read at once; event chunks are decompressed and viewed with np.frombuffer,
so loading costs one zlib pass and one concatenation however many events there are. Every
problem with the file is reported as a TraceFormatError naming the byte offset involved.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import numpy as np

MAGIC = b"NEURONTR"
FORMAT_VERSION = 1
HEADER_SIZE = 16  # magic, u32 version, u32 flags
CHUNK_HEADER = struct.Struct("<IIII")  # type, raw length, stored length, crc32

CHUNK_METADATA, CHUNK_STRINGS, CHUNK_EVENTS, CHUNK_END = 1, 2, 3, 4
CHUNK_NAMES = {CHUNK_METADATA: "metadata", CHUNK_STRINGS: "strings", CHUNK_EVENTS: "events",
               CHUNK_END: "end"}

EVENT_DTYPE = np.dtype([
    ("time_ns", "<u8"), ("duration_ns", "<u8"), ("seq", "<u8"), ("value", "<u8"),
    ("aux", "<u8"), ("op", "<u4"), ("thread", "<u2"), ("kind", "u1"), ("core", "u1"),
    ("stream", "<u2"), ("flags", "<u2"), ("reserved", "<u4")])
assert EVENT_DTYPE.itemsize == 56

# Event kinds.
OP_DISPATCH, OP_EXECUTE, SYNC, SEGMENT_CUT, KEY_HIT, KEY_MISS, MEMORY, QUEUE_DEPTH, \
    FALLBACK, COMPILE_START, COMPILE_END, SEGMENT_EXECUTE, OP_DATAFLOW, SEGMENT_LIVENESS, \
    STREAM_FLUSH, GUARD_VERDICT, SEGMENT_STATE, COLLECTIVE = range(1, 19)
KIND_NAMES = {
    OP_DISPATCH: "OpDispatch", OP_EXECUTE: "OpExecute", SYNC: "Sync",
    SEGMENT_CUT: "SegmentCut", KEY_HIT: "KeyHit", KEY_MISS: "KeyMiss", MEMORY: "Memory",
    QUEUE_DEPTH: "QueueDepth", FALLBACK: "Fallback", COMPILE_START: "CompileStart",
    COMPILE_END: "CompileEnd", SEGMENT_EXECUTE: "SegmentExecute",
    OP_DATAFLOW: "OpDataflow", SEGMENT_LIVENESS: "SegmentLiveness", STREAM_FLUSH: "StreamFlush",
    GUARD_VERDICT: "GuardVerdict", SEGMENT_STATE: "SegmentState", COLLECTIVE: "Collective",
}
# Kinds whose `op` field is not an op id (GuardVerdict: the number of samples).
NOT_OP_KINDS = (GUARD_VERDICT,)

# OpDataflow: six 21-bit slot links per event, three in value and three in aux (see
# trace/dataflow.h); flags = the event's index among the op's, or DATAFLOW_FLOPS when value
# holds the op's FLOPs instead.
LINK_NEW, LINK_OUTPUT_UNDEFINED, LINK_OUTPUT, LINK_NO_TENSOR, LINK_END = \
    0, 0x1FFFFC, 0x1FFFFD, 0x1FFFFE, 0x1FFFFF
DATAFLOW_FLOPS = 0x8000


def dataflow_links(event) -> List[int]:
    """The six link codes of one OpDataflow event (LINK_END pads the last one)."""
    return [(int(event[f]) >> (21 * i)) & 0x1FFFFF for f in ("value", "aux") for i in range(3)]
# SegmentCut flags.
CUT_REASONS = {1: "sync", 2: "barrier", 3: "content", 4: "max length", 5: "flush",
               6: "compiled region"}
# GuardVerdict flags: the online guard's verdict for a key.
GUARD_VERDICTS = {1: "kept", 2: "demoted", 3: "undecided"}
VERDICT_KEPT, VERDICT_DEMOTED, VERDICT_UNDECIDED = 1, 2, 3
# SegmentState flags: (from << 8) | to, each one of these states.
SEGMENT_STATES = {0: "cold", 1: "hot", 2: "on_trial", 3: "ready_tier1", 4: "ready_tier2",
                  5: "demoted", 6: "blacklisted"}


def state_name(state: int) -> str:
    return SEGMENT_STATES.get(int(state), f"state {int(state)}")


def transition_name(flags: int) -> str:
    """'hot -> on_trial' for a SegmentState event's flags."""
    return f"{state_name(int(flags) >> 8)} -> {state_name(int(flags) & 0xFF)}"


class TraceFormatError(ValueError):
    """The file is not a readable neuron-eager trace; the message names the byte offset."""


@dataclass
class Trace:
    """A loaded trace. `events` is a numpy structured array (EVENT_DTYPE) sorted by time."""

    metadata: Dict[str, Any]
    ops: Dict[int, str]
    strings: Dict[int, str]
    threads: Dict[int, str]
    events: np.ndarray
    version: int = FORMAT_VERSION
    path: Optional[str] = None
    file_size: Optional[int] = None
    complete: bool = True  # False only when loaded with allow_incomplete and not closed
    declared_events: Optional[int] = None  # the end chunk's count
    skipped_chunks: List[int] = field(default_factory=list)  # unknown chunk types seen

    def __len__(self) -> int:
        return len(self.events)

    def __repr__(self) -> str:
        src = f" {self.path!r}" if self.path else ""
        return (f"<Trace{src}: {len(self.events)} events, {len(self.ops)} ops, "
                f"{len(self.threads)} threads, {self.duration_ns / 1e6:.3f} ms>")

    @property
    def duration_ns(self) -> int:
        if len(self.events) == 0:
            return 0
        end = self.events["time_ns"] + self.events["duration_ns"]
        return int(end.max() - self.events["time_ns"].min())

    def op_name(self, op_id: int) -> str:
        return self.ops.get(int(op_id), f"op#{int(op_id)}") if op_id else ""

    def string(self, string_id: int) -> str:
        return self.strings.get(int(string_id), f"string#{int(string_id)}") if string_id else ""

    def thread_name(self, thread_id: int) -> str:
        return self.threads.get(int(thread_id), f"thread {int(thread_id)}")

    def of_kind(self, kind: int) -> np.ndarray:
        return self.events[self.events["kind"] == kind]

    def _lookup(self, table: Dict[int, str], ids: np.ndarray, unknown: str,
                zero: str = "") -> np.ndarray:
        """Names for an array of ids, vectorised through a dense lookup table."""
        top = int(ids.max()) if len(ids) else 0
        if top > (1 << 20):  # sparse ids (keys, garbage): name the distinct ones only
            uniq, inverse = np.unique(ids, return_inverse=True)
            names = np.array([zero if i == 0 else table.get(int(i), unknown.format(int(i)))
                              for i in uniq.tolist()], dtype=object)
            return names[inverse.reshape(-1)]
        names = np.array([unknown.format(i) for i in range(top + 1)], dtype=object)
        for i, name in table.items():
            if 0 <= i <= top:
                names[i] = name
        names[0] = zero
        return names[ids.astype(np.int64)]

    def columns(self) -> Dict[str, np.ndarray]:
        """The events as readable columns: kind/op/thread names and the resolved detail
        (sync cause, fallback reason, cut reason, guard verdict, state transition) next to
        the raw fields."""
        ev = self.events
        kinds = self._lookup(KIND_NAMES, ev["kind"], "kind{}", zero="kind0")
        detail = np.full(len(ev), "", dtype=object)
        k = ev["kind"]
        named = (k == SYNC) | (k == FALLBACK)
        if named.any():
            detail[named] = self._lookup(self.strings, ev["value"][named], "string#{}")
        cut = k == SEGMENT_CUT
        if cut.any():
            detail[cut] = self._lookup(CUT_REASONS, ev["flags"][cut], "reason {}", zero="")
        verdict = k == GUARD_VERDICT
        if verdict.any():
            detail[verdict] = self._lookup(GUARD_VERDICTS, ev["flags"][verdict], "verdict {}",
                                           zero="verdict 0")
        state = k == SEGMENT_STATE
        if state.any():
            flags = ev["flags"][state]
            uniq, inverse = np.unique(flags, return_inverse=True)
            names = np.array([transition_name(f) for f in uniq.tolist()], dtype=object)
            detail[state] = names[inverse.reshape(-1)]
        ops = self._lookup(self.ops, ev["op"], "op#{}")
        not_op = np.isin(k, NOT_OP_KINDS)
        if not_op.any():
            ops = ops.copy()
            ops[not_op] = ""
        return {
            "time_ns": ev["time_ns"], "duration_ns": ev["duration_ns"], "kind": kinds,
            "op": ops,
            "thread": self._lookup(self.threads, ev["thread"], "thread {}", zero="thread 0"),
            "core": ev["core"], "stream": ev["stream"], "seq": ev["seq"],
            "value": ev["value"], "aux": ev["aux"], "flags": ev["flags"], "detail": detail,
        }

    def to_records(self) -> List[Dict[str, Any]]:
        cols = self.columns()
        names = list(cols)
        lists = [cols[n].tolist() for n in names]
        return [dict(zip(names, row)) for row in zip(*lists)]

    def dataframe(self):
        """A pandas DataFrame of the events when pandas is installed, else to_records()."""
        try:
            import pandas as pd
        except ImportError:
            return self.to_records()
        return pd.DataFrame(self.columns())


def _error(offset: int, message: str) -> TraceFormatError:
    return TraceFormatError(f"{message} (at byte offset {offset})")


def _json_chunk(raw: bytes, offset: int, what: str) -> Dict[str, Any]:
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise _error(offset, f"corrupt {what} chunk: payload is not UTF-8 JSON ({e})") from None
    if not isinstance(obj, dict):
        raise _error(offset, f"corrupt {what} chunk: expected a JSON object, "
                             f"got {type(obj).__name__}")
    return obj


def _id_table(obj: Any, offset: int, name: str) -> Dict[int, str]:
    if obj is None:
        return {}
    if not isinstance(obj, dict):
        raise _error(offset, f"corrupt strings chunk: '{name}' is not a JSON object")
    table = {}
    for key, text in obj.items():
        try:
            ident = int(key)
        except ValueError:
            raise _error(offset, f"corrupt strings chunk: '{name}' has a non-numeric id "
                                 f"{key!r}") from None
        if not isinstance(text, str):
            raise _error(offset, f"corrupt strings chunk: '{name}' id {key} is not a string")
        table[ident] = text
    return table


def parse(data: bytes, source: str = "<bytes>", allow_incomplete: bool = False) -> Trace:
    """Parses the bytes of a trace file. allow_incomplete=True reads what a trace that was
    not closed (or was cut off) holds, up to its last whole chunk, instead of raising."""
    view = memoryview(data)
    size = len(view)
    if size < HEADER_SIZE:
        if bytes(view[:min(size, 8)]) != MAGIC[:min(size, 8)]:
            raise _error(0, f"{source} is not a neuron trace file (bad magic)")
        raise _error(size, f"{source} is truncated: data ends inside the {HEADER_SIZE}-byte "
                           f"file header")
    if bytes(view[:8]) != MAGIC:
        raise _error(0, f"{source} is not a neuron trace file (bad magic "
                        f"{bytes(view[:8])!r}, expected {MAGIC!r})")
    version, _flags = struct.unpack_from("<II", view, 8)
    if version > FORMAT_VERSION:
        raise _error(8, f"{source} was written by a newer format version {version}; this "
                        f"reader supports up to {FORMAT_VERSION}")
    if version < 1:
        raise _error(8, f"{source} has invalid format version {version}")

    metadata: Dict[str, Any] = {}
    ops: Dict[int, str] = {}
    strings: Dict[int, str] = {}
    threads: Dict[int, str] = {}
    chunks: List[np.ndarray] = []
    skipped: List[int] = []
    declared: Optional[int] = None
    offset = HEADER_SIZE
    problem: Optional[TraceFormatError] = None
    while offset < size:
        if declared is not None:
            raise _error(offset, f"corrupt {source}: {size - offset} unexpected bytes after "
                                 f"the end chunk")
        if size - offset < CHUNK_HEADER.size:
            problem = _error(size, f"{source} is truncated: data ends inside the header of the "
                                   f"chunk starting at byte {offset}; the trace was not closed")
            break
        ctype, raw_len, stored_len, crc = CHUNK_HEADER.unpack_from(view, offset)
        name = CHUNK_NAMES.get(ctype, f"type-{ctype}")
        start = offset + CHUNK_HEADER.size
        if size - start < stored_len:
            problem = _error(size, f"{source} is truncated: data ends inside the {name} chunk "
                                   f"starting at byte {offset} ({stored_len} payload bytes "
                                   f"declared, {size - start} present); the trace was not "
                                   f"closed")
            break
        stored = view[start:start + stored_len]
        actual = zlib.crc32(stored) & 0xFFFFFFFF
        if actual != crc:
            raise _error(offset, f"corrupt {name} chunk in {source}: CRC-32 mismatch (header "
                                 f"says {crc:#010x}, payload has {actual:#010x})")
        if ctype not in CHUNK_NAMES:  # a newer writer's optional chunk: skip it
            skipped.append(ctype)
            offset = start + stored_len
            continue
        try:
            raw = zlib.decompress(stored)
        except zlib.error as e:
            raise _error(offset, f"corrupt {name} chunk in {source}: payload does not "
                                 f"decompress ({e})") from None
        if len(raw) != raw_len:
            raise _error(offset, f"corrupt {name} chunk in {source}: payload decompresses to "
                                 f"{len(raw)} bytes, header says {raw_len}")
        if ctype == CHUNK_EVENTS:
            if raw_len % EVENT_DTYPE.itemsize:
                raise _error(offset, f"corrupt events chunk in {source}: {raw_len} bytes is not "
                                     f"a multiple of the {EVENT_DTYPE.itemsize}-byte record")
            chunks.append(np.frombuffer(raw, dtype=EVENT_DTYPE))
        elif ctype == CHUNK_METADATA:
            metadata.update(_json_chunk(raw, offset, "metadata"))
        elif ctype == CHUNK_STRINGS:
            obj = _json_chunk(raw, offset, "strings")
            ops.update(_id_table(obj.get("ops"), offset, "ops"))
            strings.update(_id_table(obj.get("strings"), offset, "strings"))
            threads.update(_id_table(obj.get("threads"), offset, "threads"))
        elif ctype == CHUNK_END:
            if raw_len != 8:
                raise _error(offset, f"corrupt end chunk in {source}: {raw_len} bytes, "
                                     f"expected 8")
            (declared,) = struct.unpack("<Q", raw)
        offset = start + stored_len

    if problem is None and declared is None:
        problem = _error(size, f"{source} has no end chunk: the trace was not closed "
                               f"(recording still running, or the process died); data ends "
                               f"cleanly after the last whole chunk")
    if problem is not None and not allow_incomplete:
        raise problem
    events = np.concatenate(chunks) if chunks else np.zeros(0, dtype=EVENT_DTYPE)
    if declared is not None and declared != len(events):
        raise _error(size, f"corrupt {source}: the end chunk says {declared} events, the "
                           f"event chunks hold {len(events)}")
    if len(events) > 1:
        t = events["time_ns"]
        if (t[1:] < t[:-1]).any():  # threads flush their buffers independently
            events = events[np.argsort(t, kind="stable")]
    return Trace(metadata=metadata, ops=ops, strings=strings, threads=threads,
                 events=events, version=version, file_size=size, complete=problem is None,
                 declared_events=declared, skipped_chunks=skipped)


def load(path, allow_incomplete: bool = False) -> Trace:
    """Loads a trace file. Raises TraceFormatError (a ValueError) for anything wrong with
    its contents and OSError if it cannot be read."""
    path = os.fspath(path)
    with open(path, "rb") as f:
        data = f.read()
    trace = parse(data, source=path, allow_incomplete=allow_incomplete)
    trace.path = path
    return trace
