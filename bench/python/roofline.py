"""This machine's memory bandwidth, the roofline the DRAM-sized chain is held to: STREAM
copy and triad through torch on CPU (all intra-op threads), and the C++ STREAM kernels of
bench/cpp/bench_roofline when that binary is built.

    python bench/python/roofline.py [--tiny] [--json out.json]
"""

import argparse
import glob
import json
import os
import subprocess
import time

import torch

from bench_common import write_json

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def best_time(fn, repeats):
    fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def torch_stream(nbytes, repeats):
    n = nbytes // 4
    a, b, c = torch.empty(n), torch.ones(n), torch.ones(n)
    copy = best_time(lambda: a.copy_(b), repeats)
    triad = best_time(lambda: torch.add(b, c, alpha=3.0, out=a), repeats)
    return {"copy_gbs": 2 * nbytes / copy / 1e9, "triad_gbs": 3 * nbytes / triad / 1e9}


def cpp_stream(tiny):
    """Figures from bench_roofline (Google Benchmark JSON), or None when it isn't built."""
    found = sorted(glob.glob(os.path.join(ROOT, "build", "*", "bench", "cpp", "bench_roofline")),
                   key=os.path.getmtime)
    if not found:
        return None
    args = [found[-1], "--benchmark_format=json"]
    if tiny:
        args += ["--benchmark_filter=/16777216/", "--benchmark_min_time=0.01"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=240)
    if r.returncode != 0:
        return {"error": r.stderr[-500:]}
    out = {"binary": os.path.relpath(found[-1], ROOT)}
    for b in json.loads(r.stdout)["benchmarks"]:
        out[b["name"]] = b["bytes_per_second"] / 1e9
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    nbytes, repeats = ((16 << 20), 3) if args.tiny else ((256 << 20), 7)
    res = {"bytes": nbytes, "threads": torch.get_num_threads(), "torch": torch_stream(nbytes, repeats)}
    cpp = cpp_stream(args.tiny)
    if cpp is not None:
        res["cpp"] = cpp
    # The roofline is the best any kernel reached over arrays far beyond the last-level
    # cache (256 MiB; --tiny only runs 16 MiB arrays, which may partly sit in cache).
    figures = [res["torch"]["copy_gbs"], res["torch"]["triad_gbs"]]
    cpp_figures = {k: v for k, v in (cpp or {}).items() if k.startswith("BM_")}
    large = [v for k, v in cpp_figures.items() if f"/{256 << 20}/" in k]
    res["machine_gbs"] = max(figures + (large or list(cpp_figures.values())))
    print(f"memory bandwidth: torch copy {res['torch']['copy_gbs']:.1f} GB/s, "
          f"triad {res['torch']['triad_gbs']:.1f} GB/s; roofline {res['machine_gbs']:.1f} GB/s")
    if cpp:
        for k, v in cpp.items():
            if k.startswith("BM_"):
                print(f"  {k}: {v:.1f} GB/s")
    write_json(args.json, res)


if __name__ == "__main__":
    main()
