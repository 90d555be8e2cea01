"""Counter summaries of a trace: memory peaks per core, queue depths per stream."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

import numpy as np

from .format import MEMORY, QUEUE_DEPTH


@dataclass
class MemoryStat:
    core: int
    samples: int
    peak_allocated: int
    peak_reserved: int
    last_allocated: int


@dataclass
class QueueStat:
    core: int
    stream: int
    samples: int
    max_depth: int
    avg_depth: float


def counters(ev: np.ndarray) -> Tuple[List[MemoryStat], List[QueueStat]]:
    """Memory peaks per core and queue depths per stream of a trace's events."""
    mem = ev[ev["kind"] == MEMORY]
    memory = []
    for core in np.unique(mem["core"]).tolist():
        m = mem[mem["core"] == core]
        memory.append(MemoryStat(core, len(m), int(m["value"].max()), int(m["aux"].max()),
                                 int(m["value"][-1])))
    q = ev[ev["kind"] == QUEUE_DEPTH]
    queues = []
    if len(q):
        lanes = (q["core"].astype(np.uint64) << np.uint64(16)) | q["stream"].astype(np.uint64)
        for lane in np.unique(lanes).tolist():
            d = q["value"][lanes == lane]
            queues.append(QueueStat(lane >> 16, lane & 0xFFFF, len(d), int(d.max()),
                                    float(d.mean())))
    return memory, queues
