"""Differential fuzzing at scale (issue 26 item 5): random fused programs of every kind
tier 2 generates (pointwise formulas, row reductions and per-row ops), compared bit for bit
with CPU eager, in each of three tiers: per-op eager, adaptive mode with tier-1 programs
(fused from the third occurrence, no compiler), and adaptive mode with tier 2 forced on
(every group gets a native kernel: a compiler run per program, so about 100x the cost).

    python bench/python/fuzz.py --programs 10000 --seed 7 [--kinds pointwise,rows]
        [--tiers eager,instant,native] [--native-programs N]

Programs run in batches, each batch in its own process (a crash costs one batch, and
kernels are shared through one cache folder). Batch b of kind K uses the seed
SEED * 100003 + b; every mismatch is printed with the command that replays that one
program, e.g. `python tests/python/native_diff.py --programs 24 --seed 700021 --only 5`.
Exits 1 if any program differed or any batch failed.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TESTS = os.path.join(ROOT, "tests", "python")
KINDS = {"pointwise": "native_diff.py", "rows": "row_diff.py"}


TIERS = ("eager", "instant", "native")


def run_batch(kind, tier, batch, seed, env, timeout):
    script = os.path.join(TESTS, KINDS[kind])
    cmd = [sys.executable, script, "--programs", str(batch), "--seed", str(seed), "--tier", tier]
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:.0f} s", cmd
    if p.returncode != 0:
        return None, (p.stderr or p.stdout)[-1500:].strip(), cmd
    return json.loads(p.stdout.strip().splitlines()[-1]), None, cmd


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--programs", type=int, default=10000, help="programs per kind and tier")
    ap.add_argument("--tiers", default=",".join(TIERS), help="comma-separated: " + ", ".join(TIERS))
    ap.add_argument("--native-programs", type=int, default=None,
                    help="programs per kind in the native tier (default: --programs)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kinds", default=",".join(KINDS), help="comma-separated: " + ", ".join(KINDS))
    ap.add_argument("--batch", type=int, default=24,
                    help="programs per process in the native tier (others: 10x this)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per batch")
    ap.add_argument("--cache-dir", default=None, help="kernel cache (default: a fresh temp folder)")
    ap.add_argument("--json", default=None, help="write the summary here")
    args = ap.parse_args()
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        ap.error(f"--kinds {args.kinds!r}: allowed {', '.join(KINDS)} (comma-separated)")
    tiers = [t.strip() for t in args.tiers.split(",") if t.strip()]
    if not tiers or any(t not in TIERS for t in tiers):
        ap.error(f"--tiers {args.tiers!r}: allowed {', '.join(TIERS)} (comma-separated)")
    if args.programs < 1 or args.batch < 1:
        ap.error("--programs and --batch must be at least 1")
    cache = args.cache_dir or tempfile.mkdtemp(prefix="neuron-fuzz-cache-")
    env = {**os.environ, "NEURON_CACHE_DIR": cache}
    summary = {"seed": args.seed, "kinds": {}, "mismatches": [], "failed_batches": []}
    start = time.perf_counter()
    for kind, tier in [(k, t) for t in tiers for k in kinds]:
        done = 0
        counters = {}
        programs = args.programs
        if tier == "native" and args.native_programs is not None:
            programs = args.native_programs
        batch = args.batch if tier == "native" else 10 * args.batch
        # Batch b's programs come from one seed: a batch of 240 (eager, instant) starts with
        # the 24 programs of the native batch of that seed.
        for b in range(-(-programs // batch)):
            n = min(batch, programs - b * batch)
            seed = args.seed * 100003 + b
            res, error, cmd = run_batch(kind, tier, n, seed, env, args.timeout)
            replay = " ".join(["python", os.path.relpath(cmd[1], ROOT)] + cmd[2:])
            if error:
                summary["failed_batches"].append({"kind": kind, "tier": tier, "seed": seed,
                                                  "error": error, "rerun": replay})
                print(f"[{kind}/{tier}] batch seed {seed}: FAILED: {error.splitlines()[-1] if error else ''}"
                      f"\n  rerun: {replay}", flush=True)
                continue
            done += n
            for k, v in res["counters"].items():
                counters[k] = counters.get(k, 0) + v
            for i in res["mismatches"]:
                m = {"kind": kind, "tier": tier, "seed": seed, "program": i, "shown": res["shown"].get(str(i), ""),
                     "replay": f"{replay} --only {i}"}
                summary["mismatches"].append(m)
                print(f"[{kind}/{tier}] MISMATCH program {i} of batch seed {seed}: {m['shown']}\n"
                      f"  replay: {m['replay']}", flush=True)
            print(f"[{kind}/{tier}] {done}/{programs} programs, {len(summary['mismatches'])} "
                  f"mismatches, ops in tile groups {counters.get('ops_in_tile_groups', 0)}, "
                  f"kernels built {counters.get('native_built', 0)}, accepted "
                  f"{counters.get('native_accepted', 0)}, {time.perf_counter() - start:.0f} s",
                  flush=True)
        summary["kinds"][f"{kind}/{tier}"] = {"programs": done, "counters": counters}
    summary["seconds"] = time.perf_counter() - start
    total = sum(k["programs"] for k in summary["kinds"].values())
    per = ", ".join(f"{k} {v['programs']}" for k, v in summary["kinds"].items())
    print(f"fuzz: {total} programs compared ({per}), {len(summary['mismatches'])} mismatches, "
          f"{len(summary['failed_batches'])} failed batches, {summary['seconds']:.0f} s "
          f"(seed {args.seed}, cache {cache})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    return 1 if summary["mismatches"] or summary["failed_batches"] else 0


if __name__ == "__main__":
    sys.exit(main())
