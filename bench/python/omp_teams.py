"""Why 2-thread kernels on the device worker run slower than the same kernels in CPU
eager: libgomp throttles every team's spin-wait once it manages more threads than there
are CPUs (two teams of 2 on this 2-core machine), so each parallel region pays futex
sleeps and wake-ups, as under OMP_WAIT_POLICY=passive. Plain torch, no engine: a 2-thread
matmul on the main thread alone, then on a second thread while the main thread's team
exists (what the engine's worker is), then on the main thread again. Prints one line per
case (median of --repeats runs, us per matmul) and the second thread's ratio.

    python bench/python/omp_teams.py [--size 64,256,256] [--calls 2000] [--repeats 3]

Tried and dropped (session 8): the host thread handing its team back with libgomp's
omp_pause_resource_all before each blocking wait does lift the throttle (a second
thread's 2-thread matmul went from 121 back to 88 us, its time with no other team), but
the worker's team then spins unthrottled (GOMP_SPINCOUNT's 300000 pauses) beside the
busy host thread on 2 cores: mlp_train adaptive, 3 interleaved A/B runs, 3.4-5.0 ms per
step with the hand-back against 1.7-2.6 ms without. The throttle protects the host here.
"""

import argparse
import statistics
import threading
import time

import torch


def per_call_us(a, w, calls):
    torch.set_num_threads(2)
    for _ in range(50):
        torch.mm(a, w)
    t = time.perf_counter()
    for _ in range(calls):
        torch.mm(a, w)
    return (time.perf_counter() - t) / calls * 1e6


def on_thread(fn):
    out = []
    th = threading.Thread(target=lambda: out.append(fn()))
    th.start()
    th.join()
    return out[0]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="64,256,256", help="m,k,n of the matmul")
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    m, k, n = (int(x) for x in a.size.split(","))
    x, w = torch.randn(m, k), torch.randn(k, n)
    # A second thread's team alone (the main thread has none yet), then with the main's.
    alone = statistics.median(on_thread(lambda: per_call_us(x, w, a.calls)) for _ in range(a.repeats))
    main_team = statistics.median(per_call_us(x, w, a.calls) for _ in range(a.repeats))
    second = statistics.median(on_thread(lambda: per_call_us(x, w, a.calls)) for _ in range(a.repeats))
    print(f"2-thread mm {m}x{k}x{n}: second thread, no other team   {alone:8.1f} us")
    print(f"2-thread mm {m}x{k}x{n}: main thread                    {main_team:8.1f} us")
    print(f"2-thread mm {m}x{k}x{n}: second thread beside the main's {second:8.1f} us "
          f"({second / main_team:.2f}x the main thread)")


if __name__ == "__main__":
    main()
