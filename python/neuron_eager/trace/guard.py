"""The online guard in a trace: per segment key, its verdicts (GuardVerdict events: the fused
program's median period per occurrence against the same key's per-op runs, measured on
interleaved real occurrences) and its state transitions (SegmentState events); and the
like-with-like speedup of each key that the segment tables show.

    g = summarize(load("run.ntrace")).guard
    g.demotions, g.keys[0].verdict, g.keys[0].ratio, g.keys[0].trials

A key's speedup (per-op time / fused time per occurrence) is taken, best first, from:

    guard   the latest verdict's figures: per-op median period / fused median period;
    steady  the key's occurrences after its first `warm-up` ones (hot_threshold + 2 by
            default), per-op against fused, so the cold first per-op occurrences (first
            kernel runs, fresh memory) no longer count against the fused ones;
    all     every measured occurrence (what older viewers showed), only when the trace has
            no steady occurrence on one side: it includes the cold ones and may flatter
            fusion.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from .format import (GUARD_VERDICT, GUARD_VERDICTS, SEGMENT_STATE, VERDICT_DEMOTED,
                     VERDICT_KEPT, VERDICT_UNDECIDED, state_name)

DEFAULT_HOT_THRESHOLD = 3   # the default policy's, for traces that do not name theirs
STEADY_EXTRA = 2            # occurrences skipped beyond hot_threshold before "steady"
BASES = {
    "guard": "the guard's paired medians (per-op period / fused period)",
    "steady": "steady occurrences only: each key's first {warmup} skipped as cold",
    "all": "all occurrences, the cold first ones included (no steady ones on one side)",
}


@dataclass
class GuardKey:
    key: int
    key_hex: str
    verdict: str              # the latest: kept, demoted, undecided ("" if none)
    fused_period_ns: int      # the latest verdict's median fused period per occurrence
    per_op_period_ns: int     # and the same key's per-op one
    ratio: Optional[float]    # fused / per-op period (< 1: fusion wins)
    speedup: Optional[float]  # per-op / fused period
    samples: int              # paired blocks the latest verdict compared
    trials: int               # trials the key has had (1 = first)
    retrials: int             # trials - 1
    verdicts: int             # GuardVerdict events of the key
    demotions: int            # of which demoted or undecided
    decided_ns: int           # when the latest verdict was reached
    state: str                # the latest SegmentState ("" if none)
    state_occurrence: int     # the key's occurrence count at that transition
    transitions: int          # SegmentState events of the key
    history: List[str] = field(default_factory=list)  # verdicts in order (last 8)


@dataclass
class GuardSummary:
    keys: List[GuardKey] = field(default_factory=list)
    verdicts: int = 0
    kept: int = 0
    demotions: int = 0        # verdicts that demoted a key (demoted + undecided)
    undecided: int = 0        # of which undecided after the maximum samples
    retrials: int = 0         # verdicts of a key's second or later trial
    blacklisted: int = 0      # keys whose current state is blacklisted
    transitions: int = 0
    states: Dict[str, int] = field(default_factory=dict)  # keys per current state
    steady_warmup: int = 0    # occurrences of each key the "steady" speedup skips as cold

    @property
    def present(self) -> bool:
        return bool(self.verdicts or self.transitions)

    def by_key(self) -> Dict[int, GuardKey]:
        return {g.key: g for g in self.keys}


def summarize_guard(ev: np.ndarray) -> GuardSummary:
    """The guard's verdicts and the state transitions of a trace's events (time-sorted)."""
    kind = ev["kind"]
    verdicts = ev[kind == GUARD_VERDICT]
    states = ev[kind == SEGMENT_STATE]
    out = GuardSummary(verdicts=len(verdicts), transitions=len(states))
    if not out.present:
        return out
    per_key: Dict[int, Dict[str, Any]] = {}

    def entry(key: int) -> Dict[str, Any]:
        return per_key.setdefault(key, {"verdicts": [], "state": None, "transitions": 0})

    cols = ("time_ns", "value", "aux", "seq", "op", "reserved", "flags")
    for t, key, fused, per_op, samples, trial, flag in zip(*(verdicts[c].tolist()
                                                               for c in cols)):
        entry(key)["verdicts"].append((t, fused, per_op, samples, trial, flag))
    for key, occ, flag in zip(*(states[c].tolist() for c in ("value", "aux", "flags"))):
        e = entry(key)
        e["state"] = (flag & 0xFF, occ)
        e["transitions"] += 1
    for key, e in per_key.items():
        vs = e["verdicts"]
        state, occ = e["state"] or (None, 0)
        name = state_name(state) if state is not None else ""
        if name:
            out.states[name] = out.states.get(name, 0) + 1
        if vs:
            t, fused, per_op, samples, _, flag = vs[-1]
            demoted = sum(1 for v in vs if v[5] in (VERDICT_DEMOTED, VERDICT_UNDECIDED))
            trials = max(v[4] for v in vs)
        else:
            t = fused = per_op = samples = flag = demoted = trials = 0
        out.keys.append(GuardKey(
            key=key, key_hex=f"{key:016x}",
            verdict=GUARD_VERDICTS.get(flag, f"verdict {flag}") if vs else "",
            fused_period_ns=fused, per_op_period_ns=per_op,
            ratio=fused / per_op if fused and per_op else None,
            speedup=per_op / fused if fused and per_op else None,
            samples=samples, trials=trials, retrials=max(trials - 1, 0), verdicts=len(vs),
            demotions=demoted, decided_ns=t, state=name, state_occurrence=occ,
            transitions=e["transitions"],
            history=[GUARD_VERDICTS.get(v[5], f"verdict {v[5]}") for v in vs[-8:]]))
    flags = verdicts["flags"]
    out.kept = int((flags == VERDICT_KEPT).sum())
    out.undecided = int((flags == VERDICT_UNDECIDED).sum())
    out.demotions = int((flags == VERDICT_DEMOTED).sum()) + out.undecided
    out.retrials = int((verdicts["reserved"] > 1).sum())
    out.blacklisted = out.states.get("blacklisted", 0)
    # Most time at stake first: the slower side's period, then the key.
    out.keys.sort(key=lambda g: (-max(g.per_op_period_ns, g.fused_period_ns), -g.verdicts,
                                 g.key))
    return out


def warmup_occurrences(metadata: Dict[str, Any]) -> int:
    """Occurrences of each key treated as cold: the recorded policy's hot_threshold (the
    default policy's when the trace does not say) plus STEADY_EXTRA."""
    policy = metadata.get("policy")
    hot = policy.get("hot_threshold") if isinstance(policy, dict) else None
    if not isinstance(hot, (int, float)) or isinstance(hot, bool) or hot < 0:
        hot = DEFAULT_HOT_THRESHOLD
    return int(hot) + STEADY_EXTRA


def occurrence_rank(keys: np.ndarray, seqs: np.ndarray) -> np.ndarray:
    """For each cut, how many cuts of its key come before it (in seq order)."""
    n = len(keys)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort((seqs, keys))
    k = keys[order]
    starts = np.concatenate([[0], np.flatnonzero(k[1:] != k[:-1]) + 1])
    sizes = np.diff(np.concatenate([starts, [n]]))
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n) - np.repeat(starts, sizes)
    return rank


def steady_averages(keys: np.ndarray, inverse: np.ndarray, rank: np.ndarray,
                    warmup: int, per_op_ns: np.ndarray, measured: np.ndarray,
                    is_fused: np.ndarray, fused_ns: np.ndarray,
                    extra_fused: Dict[int, Tuple[int, float]]
                    ) -> Dict[int, Tuple[float, float]]:
    """Per key, (per-op avg, fused avg) per occurrence over its steady occurrences (rank >=
    warmup), where both sides have some. Per-cut arrays; `extra_fused` adds fused runs that
    lie in no cut (a trace cut short: late, so steady) as key -> (count, ns)."""
    steady = rank >= warmup
    m = len(keys)

    def total(weights):
        return np.bincount(inverse, weights=np.asarray(weights, dtype=np.float64),
                           minlength=m)

    p_sum, p_n = total(per_op_ns * steady), total(measured * steady)
    f_sum, f_n = total(fused_ns * (is_fused & steady)), total(is_fused & steady)
    out = {}
    for i, key in enumerate(keys.tolist()):
        xn, xs = extra_fused.get(key, (0, 0.0))
        fn, fs = f_n[i] + xn, f_sum[i] + xs
        if p_n[i] and fn and p_sum[i] and fs:
            out[key] = (p_sum[i] / p_n[i], fs / fn)
    return out


def choose_speedup(key: int, guard: Dict[int, GuardKey],
                   steady: Dict[int, Tuple[float, float]], per_op_avg: float,
                   fused_avg: float) -> Tuple[Optional[float], str]:
    """(speedup, basis) of a key: the guard's, else steady occurrences', else all."""
    g = guard.get(key)
    if g is not None and g.speedup:
        return g.speedup, "guard"
    if key in steady:
        p, f = steady[key]
        return p / f, "steady"
    if per_op_avg and fused_avg:
        return per_op_avg / fused_avg, "all"
    return None, ""


SPEEDUP_HEAD = "speedup: per-op time / fused time per occurrence of the key, from"


def basis_items(warmup: int) -> List[str]:
    """What each basis letter of the speedup column means ('g = ...', 's = ...', ...)."""
    return [f"{b[0]} = {text.format(warmup=warmup)}" for b, text in BASES.items()]


def basis_legend(warmup: int) -> str:
    """What the speedup column measures, in one line."""
    return SPEEDUP_HEAD + ": " + "; ".join(basis_items(warmup))
