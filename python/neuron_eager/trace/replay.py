"""Offline replay: what a fusion policy would have done on a recorded trace, and what it
would have cost, in seconds, without running anything (docs/heuristics.md).

    from neuron_eager.trace import replay as rp
    prepared = rp.prepare("run.ntrace")               # once per trace
    report = rp.replay(prepared, "aggressive")        # a built-in, a policy file or a Policy
    report.device_ms, report.compiles, report.hit_rate, report.keys[0]

The decisions are the adaptive controller's (engine/adaptive_cut.cpp decides at each
segment cut), re-run by the C++ core (fusion/replay.h: replay_trace.cpp prepares a trace,
replay.cpp replays it, replay_costs.cpp predicts device time): content-defined
segmenting (the same trace::Segmenter and fusion::segment_policy_of as the engine),
hotness, the cost gate and the tier.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Union

import numpy as np

from .format import Trace, load

COST_MODELS = ("measured", "trn2")


def _C():
    from neuron_eager import _C as c  # the extension: replay's core is C++
    return c


def _knob_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


class Policy:
    """A fusion policy for replay (and, for its knobs, for real runs via set_policy).

    Policy(base="default", **knobs): start from a built-in policy (default, aggressive,
    conservative, never) or a policy file, then override knobs by name; every knob of
    `neuron_eager.trace.replay.knobs()` is allowed. A bad knob raises ValueError naming the
    key and its allowed range, when the policy is made and when a knob is assigned.

    Hooks a subclass may define, honoured by replay:
      should_compile(self, segment) -> bool
          replaces the cost gate for a hot key. segment: dict with key, length, first_op
          (op name), count (occurrences so far), per_op_ns and fused_ns (predicted per
          occurrence by the cost model in use).
      cut_after_ops: list of op names after which segments also end (replay only).
    """

    cut_after_ops: Sequence[str] = ()

    def __init__(self, base: str = "default", **knobs: Any):
        object.__setattr__(self, "base", os.fspath(base))
        object.__setattr__(self, "knobs", {})
        for key, value in knobs.items():
            self.knobs[key] = _knob_text(value)
        self.resolved()  # validates

    def __setattr__(self, key: str, value: Any) -> None:
        if key in ("cut_after_ops",) or key.startswith("_"):
            object.__setattr__(self, key, value)
            return
        trial = dict(self.knobs)
        trial[key] = _knob_text(value)
        _C()._replay_policy(self.base, list(trial.items()))  # raises ValueError when bad
        self.knobs[key] = trial[key]

    def __getattr__(self, key: str) -> Any:
        resolved = self.resolved()
        if key in resolved:
            return resolved[key]
        raise AttributeError(key)

    def resolved(self) -> Dict[str, Any]:
        """Every knob's value (the base with the overrides applied), as the engine's JSON."""
        return json.loads(_C()._replay_policy(self.base, list(self.knobs.items())))

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.resolved()["name"]

    @classmethod
    def from_json(cls, knobs: Dict[str, Any]) -> "Policy":
        """The policy a trace was recorded under (its metadata's "policy")."""
        values = {k: v for k, v in knobs.items() if k in knobs_allowed()}
        return cls("default", **values)

    def has_hook(self) -> bool:
        return type(self).should_compile is not Policy.should_compile

    def should_compile(self, segment: Dict[str, Any]) -> bool:  # pragma: no cover - hook
        raise NotImplementedError

    def __repr__(self) -> str:
        extra = "".join(f", {k}={v!r}" for k, v in self.knobs.items())
        return f"{type(self).__name__}({self.base!r}{extra})"


def knobs_allowed() -> List[str]:
    return [line.split(" ", 1)[0] for line in _C().policy_knobs().splitlines() if line]


def knobs() -> str:
    """The documented knobs: name, default, range and meaning, one per line."""
    return _C().policy_knobs()


def load_policy_object(spec: str) -> Policy:
    """A Python policy from 'file.py:Name' or 'package.module:Name' (a Policy subclass or
    an instance)."""
    where, _, name = spec.rpartition(":")
    if where.endswith(".py"):
        loader = importlib.util.spec_from_file_location("_neuron_policy", where)
        if loader is None or loader.loader is None:
            raise ValueError(f"neuron: cannot load policy module {where!r}")
        module = importlib.util.module_from_spec(loader)
        loader.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    obj = getattr(module, name, None)
    if obj is None:
        raise ValueError(f"neuron: {where!r} has no policy named {name!r}")
    policy = obj() if isinstance(obj, type) else obj
    if not isinstance(policy, Policy):
        raise ValueError(f"neuron: {spec!r} is not a neuron_eager.trace.replay.Policy")
    return policy


def as_policy(policy: Union[str, os.PathLike, Policy, Dict[str, Any]], trace: Optional[Trace] = None) -> Policy:
    """A built-in name, a policy file, 'file.py:Class', a dict of knobs (optional "base"),
    "recorded" (the trace's own policy) or a Policy."""
    if isinstance(policy, Policy):
        return policy
    if isinstance(policy, dict):
        values = dict(policy)
        return Policy(values.pop("base", "default"), **values)
    spec = os.fspath(policy)
    if spec == "recorded":
        if trace is None or not isinstance(trace.metadata.get("policy"), dict):
            raise ValueError("neuron: the trace does not say which policy it was recorded under")
        return Policy.from_json(trace.metadata["policy"])
    if ":" in spec and not os.path.exists(spec):
        return load_policy_object(spec)
    return Policy(spec)


@dataclass
class Prepared:
    """A trace ready for replay: loaded, its dataflow resolved (C++). Reuse it across
    policies; preparing is most of the cost."""

    trace: Trace
    core: Any
    prepare_s: float

    @property
    def ops(self) -> int:
        return self.core.ops


def prepare(trace: Union[str, os.PathLike, Trace], allow_incomplete: bool = False) -> Prepared:
    if not isinstance(trace, Trace):
        trace = load(trace, allow_incomplete=allow_incomplete)
    t0 = time.perf_counter()
    events = np.ascontiguousarray(trace.events)
    core = _C()._replay_prepare(events)
    return Prepared(trace, core, time.perf_counter() - t0)


@dataclass
class KeyReport:
    key: int
    length: int
    first_op: str
    occurrences: int
    fused: int
    compiled_at: int          # occurrence whose cut built the program; -1: never
    decision: str             # fused | cold | rejected: cost gate | rejected: single op
    native: bool              # the policy's tier would also build a native program
    per_op_ns: float          # predicted per occurrence, run op by op
    fused_ns: float           # predicted per occurrence, fused

    @property
    def predicted_ns(self) -> float:
        return (self.occurrences - self.fused) * self.per_op_ns + self.fused * self.fused_ns


@dataclass
class ReplayReport:
    policy: Dict[str, Any]
    cost_model: str
    device_ns: float
    per_op_ns: float
    fused_ns: float
    compile_ns: float
    compiles: int
    native_compiles: int
    ops: int
    ops_fused: int
    occurrences: int
    occurrences_fused: int
    matched_segments: int
    key_mismatches: int
    fused_ratio: float
    replay_s: float
    keys: List[KeyReport] = field(default_factory=list)
    occurrences_table: Dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    compiled_keys: List[int] = field(default_factory=list, repr=False)

    @property
    def device_ms(self) -> float:
        return self.device_ns / 1e6

    @property
    def hit_rate(self) -> float:
        """Share of ops that ran in fused segments."""
        return self.ops_fused / self.ops if self.ops else 0.0

    @property
    def segment_hit_rate(self) -> float:
        return self.occurrences_fused / self.occurrences if self.occurrences else 0.0

    def to_dict(self) -> Dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k not in ("keys", "occurrences_table")}
        d["hit_rate"] = self.hit_rate
        d["keys"] = [k.__dict__ for k in self.keys]
        return d


def replay(prepared: Union[Prepared, str, os.PathLike, Trace], policy: Any = "default",
           cost_model: str = "measured", trn2: Optional[Dict[str, float]] = None) -> ReplayReport:
    """Replays a trace under a policy; see the module doc."""
    if not isinstance(prepared, Prepared):
        prepared = prepare(prepared)
    if cost_model not in COST_MODELS:
        raise ValueError(f"neuron: cost model {cost_model!r} (allowed: {', '.join(COST_MODELS)})")
    trace = prepared.trace
    pol = as_policy(policy, trace)
    resolved = pol.resolved()
    recorded = trace.metadata.get("policy")
    if isinstance(recorded, dict) and "lift_scalars" in recorded and \
            recorded["lift_scalars"] != resolved["lift_scalars"]:
        raise ValueError("neuron: policy key 'lift_scalars' must match the trace's "
                         f"({recorded['lift_scalars']}): op signatures were recorded with it")
    names = {name: op_id for op_id, name in trace.ops.items()}
    cut = []
    if resolved["cut_after_matmul"]:
        cut += [names[n] for n in _C()._matmul_class_ops() if n in names]
    cut += [names[n] for n in pol.cut_after_ops if n in names]
    hook = None
    if pol.has_hook():
        def hook(segment: Dict[str, Any]) -> bool:
            segment = dict(segment)
            segment["first_op"] = trace.op_name(segment["first_op"])
            return bool(pol.should_compile(segment))
    # Op names by id: content cuts hash ops by name (as the engine does).
    op_names = [""] * (max(trace.ops, default=-1) + 1)
    for op_id, name in trace.ops.items():
        op_names[op_id] = name
    t0 = time.perf_counter()
    r = _C()._replay_run(prepared.core, pol.base, list(pol.knobs.items()), cost_model,
                         dict(trn2 or {}), sorted(set(cut)), hook,
                         sorted(i for n, i in names.items() if n.startswith("aten::_foreach_")),
                         op_names)
    elapsed = time.perf_counter() - t0
    keys = [KeyReport(k["key"], k["length"], trace.op_name(k["first_op"]), k["occurrences"],
                      k["fused"], k["compiled_at"], k["decision"], k["native"], k["per_op_ns"],
                      k["fused_ns"]) for k in r["keys"]]
    occ = {name[4:]: r[name] for name in ("occ_stream", "occ_first_seq", "occ_length",
                                          "occ_key", "occ_reason", "occ_fused")}
    return ReplayReport(json.loads(r["policy"]), cost_model, r["device_ns"], r["per_op_ns"],
                        r["fused_ns"], r["compile_ns"], r["compiles"], r["native_compiles"],
                        r["ops"], r["ops_fused"], r["occurrences"], r["occurrences_fused"],
                        r["matched_segments"], r["key_mismatches"], r["fused_ratio"], elapsed,
                        keys, occ, list(r["compiled_keys"]))


def recorded_decisions(trace: Trace) -> Dict[str, Any]:
    """What the recording itself decided: every segment occurrence (first seq, length,
    key, cut reason, ran fused or not) and the keys it compiled, in order."""
    from .format import COMPILE_END, SEGMENT_CUT, SEGMENT_EXECUTE
    ev = trace.events
    cuts = ev[ev["kind"] == SEGMENT_CUT]
    fused = ev[ev["kind"] == SEGMENT_EXECUTE]
    fused_at = set(zip(fused["seq"].tolist(), fused["value"].tolist()))
    compiles = ev[(ev["kind"] == COMPILE_END) & (ev["aux"] != 2)]  # tier 1: what replay decides
    return {
        "first_seq": cuts["seq"].astype(np.uint64), "length": cuts["aux"].astype(np.uint32),
        "key": cuts["value"].astype(np.uint64), "reason": cuts["flags"].astype(np.uint8),
        "fused": np.array([(s, k) in fused_at for s, k in zip(cuts["seq"].tolist(),
                                                            cuts["value"].tolist())], dtype=np.uint8),
        "compiled_keys": compiles["value"].tolist(),
    }


def sweep(prepared: Prepared, base: Any, knob: str, values: Iterable[Any],
          cost_model: str = "measured") -> List[ReplayReport]:
    """One replay per value of one knob, on top of a base policy."""
    pol = as_policy(base, prepared.trace)
    reports = []
    for v in values:
        knobs = dict(pol.knobs)
        knobs[knob] = _knob_text(v)
        p = type(pol).__new__(type(pol))
        object.__setattr__(p, "base", pol.base)
        object.__setattr__(p, "knobs", knobs)
        if "cut_after_ops" in pol.__dict__:
            object.__setattr__(p, "cut_after_ops", pol.cut_after_ops)
        p.resolved()  # validates the swept value
        reports.append(replay(prepared, p, cost_model))
    return reports


def check_reproduction(trace: Union[Trace, Prepared], policy: Any = "recorded") -> Dict[str, Any]:
    """Replays a trace under the policy it was recorded with and compares decisions with
    the recording's: every segment occurrence (first op, length, key, cut reason, fused or
    not) and the keys compiled, in order. `exact` is True when all agree."""
    prepared = trace if isinstance(trace, Prepared) else prepare(trace)
    rep = replay(prepared, policy)
    rec = recorded_decisions(prepared.trace)
    dispatched = prepared.trace.events["seq"][prepared.trace.events["kind"] == 1]
    known = np.isin(rec["first_seq"], dispatched) & (rec["length"] > 0)

    def rows(first, length, key, reason, fused):
        return set(zip(first.tolist(), length.tolist(), key.tolist(), reason.tolist(),
                       fused.tolist()))
    recorded = rows(rec["first_seq"][known], rec["length"][known], rec["key"][known],
                    rec["reason"][known], rec["fused"][known])
    o = rep.occurrences_table
    replayed = rows(o["first_seq"], o["length"], o["key"], o["reason"], o["fused"])
    return {"exact": recorded == replayed and rec["compiled_keys"] == rep.compiled_keys,
            "occurrences": len(recorded), "only_recorded": sorted(recorded - replayed)[:10],
            "only_replayed": sorted(replayed - recorded)[:10],
            "missing_count": len(recorded - replayed), "extra_count": len(replayed - recorded),
            "compiled_recorded": len(rec["compiled_keys"]), "compiled_replayed": len(rep.compiled_keys),
            "compiled_equal": rec["compiled_keys"] == rep.compiled_keys, "report": rep}


def measured_device_ns(trace: Trace) -> float:
    """Device time a run measured: fused segments (SegmentExecute) plus ops run on their own
    (OpExecute not nested in a fused segment on the same worker thread)."""
    from .format import OP_EXECUTE, SEGMENT_EXECUTE
    ev = trace.events
    seg = ev[ev["kind"] == SEGMENT_EXECUTE]
    ops = ev[ev["kind"] == OP_EXECUTE]
    total = float(seg["duration_ns"].sum())
    nested = np.zeros(len(ops), dtype=bool)
    for thread in np.unique(seg["thread"]):
        s = seg[seg["thread"] == thread]
        order = np.argsort(s["time_ns"])
        starts, ends = s["time_ns"][order], (s["time_ns"] + s["duration_ns"])[order]
        mine = ops["thread"] == thread
        t = ops["time_ns"][mine]
        i = np.searchsorted(starts, t, side="right") - 1
        inside = (i >= 0) & (t < ends[np.clip(i, 0, None)])
        nested[np.nonzero(mine)[0][inside]] = True
    return total + float(ops["duration_ns"][~nested].sum())
