"""What the bench scripts share: a median time over repeats and the --json output."""

from __future__ import annotations

import json
import statistics
import time


def median_time(fn, sync, warmup: int = 1, repeats: int = 5) -> tuple[float, float, float]:
    """Median, min and max seconds of `repeats` calls of fn, each followed by sync(), after
    `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times), min(times), max(times)


def write_json(path: str | None, obj, indent: int = 2) -> None:
    """Writes obj to path as JSON; no path, nothing written (the scripts' --json default)."""
    if path:
        with open(path, "w") as f:
            json.dump(obj, f, indent=indent)
