"""Host cost per tiny op: an add of two 16-element tensors, many times, on `neuron`
eager against CPU eager, as a ratio from one run.

    python bench/python/tiny_op.py [--ops 200000] [--repeats 5]
"""

import argparse
import statistics
import time

import torch

from bench_common import write_json


# Ops per burst: below the engine's backpressure limit (1024 queued ops per stream), so
# the host cost is the dispatch cost alone, never a wait for a full queue; the device
# finishes each burst before the next starts (that wait counts in the throughput only).
BURST = 500


def per_op_us(device: str, n_ops: int, wait: bool) -> tuple[float, float]:
    a = torch.randn(16, device=device)
    b = torch.randn(16, device=device)
    for _ in range(1000):  # warm-up: shape cache, allocator free lists
        c = a + b
    if device != "cpu":
        torch.neuron.synchronize()
    host = 0.0
    start = time.perf_counter()
    for _ in range(max(1, n_ops // BURST)):
        t0 = time.perf_counter()
        for _ in range(BURST):
            c = a + b
        host += time.perf_counter() - t0
        if device != "cpu" and wait:
            torch.neuron.synchronize()
    total = time.perf_counter() - start
    n = max(1, n_ops // BURST) * BURST
    return host / n * 1e6, total / n * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--ops", type=int, default=200_000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", default=None, help="also write the figures to this file")
    args = p.parse_args()
    cpu, host, through = [], [], []
    for _ in range(args.repeats):
        cpu.append(per_op_us("cpu", args.ops, True)[0])
        h, t = per_op_us("neuron", args.ops, True)
        host.append(h)
        through.append(t)
    res = {
        "cpu_eager_us_per_op": statistics.median(cpu),
        "neuron_host_us_per_op": statistics.median(host),
        "neuron_throughput_us_per_op": statistics.median(through),
    }
    res["host_cost_ratio"] = res["neuron_host_us_per_op"] / res["cpu_eager_us_per_op"]
    res["throughput_ratio"] = res["neuron_throughput_us_per_op"] / res["cpu_eager_us_per_op"]
    print(f"tiny add (16 elements), {args.ops} ops x {args.repeats} repeats, medians:")
    print(f"  CPU eager                : {res['cpu_eager_us_per_op']:.2f} us/op")
    print(f"  neuron eager, host cost  : {res['neuron_host_us_per_op']:.2f} us/op  "
          f"(ratio {res['host_cost_ratio']:.2f}x CPU eager)")
    print(f"  neuron eager, to finish  : {res['neuron_throughput_us_per_op']:.2f} us/op  "
          f"(ratio {res['throughput_ratio']:.2f}x CPU eager)")
    write_json(args.json, res)


if __name__ == "__main__":
    main()
