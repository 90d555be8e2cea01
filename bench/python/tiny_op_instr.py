"""Instructions per tiny op on the dispatching thread, `neuron` eager against CPU eager,
counted by valgrind's callgrind (exact and independent of the machine's load, where wall
times on a shared VM drift by 30%).

Each device runs in a child under callgrind with instrumentation off; once its warm-up
is done, instrumentation is switched on for exactly --ops adds of two 16-element tensors
(and the final sync) and off again. The main thread's count per op is the host cost in
instructions; CPU eager's includes the kernel itself, neuron's includes queueing it (the
worker thread runs the kernel, and spins while idle: counted apart).

    python bench/python/tiny_op_instr.py [--ops 20000] [--json out.json]
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time

from bench_common import write_json


def child(device: str, ops: int, gate: str) -> None:
    import torch

    a = torch.randn(16, device=device)
    b = torch.randn(16, device=device)
    for _ in range(2000):
        c = a + b
    sync = torch.neuron.synchronize if device != "cpu" else (lambda: None)
    sync()

    def signal_and_wait(mine: str, theirs: str) -> None:
        open(os.path.join(gate, mine), "w").close()
        while not os.path.exists(os.path.join(gate, theirs)):
            time.sleep(0.05)

    signal_and_wait("ready", "on")
    for _ in range(ops):
        c = a + b
    sync()
    del c
    signal_and_wait("done", "off")


def thread_totals(prefix: str) -> dict[int, int]:
    """Instructions per callgrind thread file (prefix-01 is the main thread)."""
    out = {}
    for path in sorted(glob.glob(prefix + "-*")):
        with open(path) as f:
            for line in f:  # the last "totals:" line holds the thread's count
                if line.startswith("totals:"):
                    out[int(path.rsplit("-", 1)[1])] = int(line.split()[1])
    return out


def measure(device: str, ops: int, work: str) -> dict[int, int]:
    gate = os.path.join(work, device)
    os.makedirs(gate)
    prefix = os.path.join(work, f"cg_{device}")
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes",
           f"--callgrind-out-file={prefix}", sys.executable, os.path.abspath(__file__),
           "--child", device, "--ops", str(ops), "--gate", gate]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def wait_for(name: str) -> None:
        while not os.path.exists(os.path.join(gate, name)):
            if proc.poll() is not None:
                raise SystemExit(f"{device} child failed:\n{proc.stderr.read()[-2000:]}")
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
        raise SystemExit(f"{device} child failed:\n{proc.stderr.read()[-2000:]}")
    return thread_totals(prefix)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", type=int, default=20000)
    p.add_argument("--json", default=None)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--gate", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child, args.ops, args.gate)
        return
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            raise SystemExit(f"tiny_op_instr.py needs {tool} (Debian package valgrind)")
    res = {"ops": args.ops}
    with tempfile.TemporaryDirectory() as work:
        for device in ("cpu", "neuron"):
            totals = measure(device, args.ops, work)
            res[device] = {"host_instructions_per_op": totals.get(1, 0) / args.ops,
                           "other_threads_instructions_per_op":
                               sum(v for k, v in totals.items() if k != 1) / args.ops}
    res["host_ratio"] = (res["neuron"]["host_instructions_per_op"] /
                         res["cpu"]["host_instructions_per_op"])
    print(f"tiny add (16 elements), {args.ops} ops, instructions per op (callgrind):")
    for device in ("cpu", "neuron"):
        r = res[device]
        print(f"  {device:6s} host thread {r['host_instructions_per_op']:8.0f}   "
              f"other threads {r['other_threads_instructions_per_op']:8.0f}")
    print(f"  neuron / CPU eager, host thread: {res['host_ratio']:.3f}x")
    write_json(args.json, res)


if __name__ == "__main__":
    main()
