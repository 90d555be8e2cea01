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


# --- instruction counts under callgrind ------------------------------------------------
# A child runs under callgrind with instrumentation off; it signals "ready" once warmed
# up, the parent switches instrumentation on and answers "on", the child runs the measured
# part and signals "done", the parent switches it off and answers "off". Gate files in a
# folder carry the signals.


def gate_signal_and_wait(gate: str, mine: str, theirs: str) -> None:
    """Child side: signal `mine`, then wait for the parent's `theirs`."""
    import os

    open(os.path.join(gate, mine), "w").close()
    while not os.path.exists(os.path.join(gate, theirs)):
        time.sleep(0.05)


def callgrind_thread_totals(prefix: str) -> dict[int, int]:
    """Instructions per callgrind thread file (thread 1 is the main thread)."""
    import glob

    out = {}
    for path in sorted(glob.glob(prefix + "-*")):
        with open(path) as f:
            for line in f:  # the last "totals:" line holds the thread's count
                if line.startswith("totals:"):
                    out[int(path.rsplit("-", 1)[1])] = int(line.split()[1])
    return out


def callgrind_measure(child_argv: list[str], prefix: str, gate: str) -> dict[int, int]:
    """Runs child_argv (a Python script and its arguments, speaking the gate protocol in
    folder `gate`) under callgrind; returns instructions per thread of the measured part."""
    import os
    import subprocess
    import sys

    os.makedirs(gate, exist_ok=True)
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes",
           f"--callgrind-out-file={prefix}", sys.executable, *child_argv]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def wait_for(name: str) -> None:
        while not os.path.exists(os.path.join(gate, name)):
            if proc.poll() is not None:
                raise SystemExit(f"child {child_argv} failed:\n{proc.stderr.read()[-2000:]}")
            time.sleep(0.1)

    def control(switch: str, name: str) -> None:
        subprocess.run(["callgrind_control", "-i", switch, str(proc.pid)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        open(os.path.join(gate, name), "w").close()

    wait_for("ready")
    control("on", "on")
    wait_for("done")
    control("off", "off")
    if proc.wait() != 0:
        raise SystemExit(f"child {child_argv} failed:\n{proc.stderr.read()[-2000:]}")
    return callgrind_thread_totals(prefix)


def require_callgrind(script: str) -> None:
    import shutil

    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{script} needs {tool} (Debian package valgrind)")
