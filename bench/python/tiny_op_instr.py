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
import os
import tempfile

from bench_common import callgrind_measure, gate_signal_and_wait, require_callgrind, write_json


def child(device: str, ops: int, gate: str) -> None:
    import torch

    a = torch.randn(16, device=device)
    b = torch.randn(16, device=device)
    for _ in range(2000):
        c = a + b
    sync = torch.neuron.synchronize if device != "cpu" else (lambda: None)
    sync()

    gate_signal_and_wait(gate, "ready", "on")
    for _ in range(ops):
        c = a + b
    sync()
    del c
    gate_signal_and_wait(gate, "done", "off")


def measure(device: str, ops: int, work: str) -> dict[int, int]:
    gate = os.path.join(work, device)
    return callgrind_measure([os.path.abspath(__file__), "--child", device, "--ops", str(ops),
                              "--gate", gate], os.path.join(work, f"cg_{device}"), gate)


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
    require_callgrind("tiny_op_instr.py")
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
