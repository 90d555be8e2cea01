"""The benchmark suite: every workload under CPU eager, `neuron` eager, `neuron` adaptive
and torch.compile (Inductor on CPU), ratios taken within one run, checked against CPU
eager, compared with the targets of issue 6.

    python bench/python/suite.py [--tiny] [--repeats 7] [--out bench/results/suite]
                                 [--only chain_small,adamw] [--configs cpu,adaptive]
                                 [--rounds 3]

Writes OUT/results.json, OUT/results.md and OUT/results.png, and prints the tables.
Each (workload, config) runs in its own process (--isolate job; --tiny runs one process
per config), so torch.compile state, thread pools and the adaptive caches never carry
over. Compile caches (Inductor's and neuron's) start empty for every process unless
--warm-caches: compile times are cold-start times.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

from suite_workloads import all_workloads  # noqa: E402
from suite_worker import CONFIGS  # noqa: E402
import suite_report  # noqa: E402


def busy_seconds():
    """CPU seconds every core has spent busy so far (all processes on the machine)."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def children_seconds():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_job(cmd, env, timeout, log):
    """Runs one child; returns (returncode, wall seconds, cores kept busy by other work)."""
    busy0, kids0, t0 = busy_seconds(), children_seconds(), time.perf_counter()
    try:
        r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=timeout)
        code, text = r.returncode, r.stdout
    except subprocess.TimeoutExpired as e:
        code, text = -1, (e.stdout or "") if isinstance(e.stdout, str) else ""
        text += f"\n[suite] timed out after {timeout} s"
    wall = time.perf_counter() - t0
    others = (busy_seconds() - busy0 - (children_seconds() - kids0)) / max(wall, 1e-9)
    log.write(f"$ {' '.join(cmd)}\n{text}\n")
    log.flush()
    return code, wall, max(0.0, others), text


def job_env(args, cache_root, config):
    env = dict(os.environ)
    if config in ("cpu", "compile"):
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"  # plain PyTorch, no neuron threads
    if not args.warm_caches:
        env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache_root, "inductor")
        env["NEURON_CACHE_DIR"] = os.path.join(cache_root, "neuron")
    return env


def mark_crashed(out, names, config, code, text):
    """A raw result for every workload a crashed worker left without one."""
    tail = " | ".join(line for line in text.strip().splitlines()[-3:])[-400:]
    for name in names:
        path = os.path.join(out, "raw", f"{name}__{config}.json")
        if not os.path.exists(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                json.dump({"workload": name, "config": config, "ok": False,
                           "error": f"worker exited with {code}: {tail}"}, f)


def merge_rounds(out, names, configs, rounds):
    """Per (workload, config), the round with the median step time stands for the job
    (every round's median is kept in rounds_ms); a failed round makes the job failed."""
    for name in names:
        for config in configs:
            figs = []
            for r in range(rounds):
                path = os.path.join(out, "raw", f"{name}__{config}.round{r}.json")
                figs.append(json.load(open(path)) if os.path.exists(path) else
                            {"ok": False, "error": f"round {r + 1}: no result"})
            bad = [f for f in figs if not f.get("ok")]
            if bad:
                chosen = bad[0]
            else:
                ranked = sorted(figs, key=lambda f: f["median_ms"])
                chosen = dict(ranked[(len(ranked) - 1) // 2])
                chosen["rounds_ms"] = [f["median_ms"] for f in figs]
            with open(os.path.join(out, "raw", f"{name}__{config}.json"), "w") as f:
                json.dump(chosen, f)


def git_commit():
    try:
        return subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


def side_measurements(args, log):
    """Machine bandwidth (roofline) and host cost per tiny op, each in its own process."""
    out = {}
    path = os.path.join(args.out, "roofline.json")
    cmd = [sys.executable, os.path.join(HERE, "roofline.py"), "--json", path]
    if args.tiny:
        cmd.append("--tiny")
    code, _, _, text = run_job(cmd, dict(os.environ), 300, log)
    out["bandwidth"] = json.load(open(path)) if code == 0 else {"error": text[-500:]}
    path = os.path.join(args.out, "tiny_op.json")
    ops, reps = ("2000", "1") if args.tiny else ("200000", "5")
    cmd = [sys.executable, os.path.join(HERE, "tiny_op.py"), "--ops", ops, "--repeats", reps,
           "--json", path]
    code, _, _, text = run_job(cmd, dict(os.environ), 300, log)
    out["tiny_op"] = json.load(open(path)) if code == 0 else {"error": text[-500:]}
    # What bounds the DRAM chain: its ATen kernels on one cache-resident tile, one thread.
    cmd = [sys.executable, os.path.join(HERE, "chain_bound.py"), "--floor", "32x128" if args.tiny else "32x4096"]
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")  # plain PyTorch
    code, _, _, text = run_job(cmd, env, 300, log)
    try:
        out["chain_floor"] = json.loads(text.strip().splitlines()[-1]) if code == 0 else {"error": text[-500:]}
    except (ValueError, IndexError):
        out["chain_floor"] = {"error": f"unreadable output: {text[-500:]}"}
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="tiny sizes: a smoke run (< 1 min)")
    p.add_argument("--repeats", type=int, default=None, help="timed repeats (default 7, tiny 2)")
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "suite"))
    p.add_argument("--only", default="", help="comma-separated workload names")
    p.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated configs")
    p.add_argument("--isolate", choices=("job", "config"), default=None,
                   help="one process per (workload, config) [default] or per config [--tiny]")
    p.add_argument("--warm-caches", action="store_true",
                   help="keep Inductor's and neuron's compile caches between processes")
    p.add_argument("--compile-backend", default=None,
                   help="torch.compile backend (default inductor; --tiny: eager, i.e. Dynamo "
                        "capture without codegen, so a smoke run stays under a minute)")
    p.add_argument("--timeout", type=int, default=900, help="seconds per process")
    p.add_argument("--no-side", action="store_true", help="skip roofline and tiny-op runs")
    p.add_argument("--rounds", type=int, default=1,
                   help="run every job this many times, configs in a rotated order per round, "
                        "and keep each job's median round (a slow period of a shared machine "
                        "then lands on every config alike)")
    args = p.parse_args()
    repeats = args.repeats or (2 if args.tiny else 7)
    isolate = args.isolate or ("config" if args.tiny else "job")
    backend = args.compile_backend or ("eager" if args.tiny else "inductor")
    workloads = all_workloads(args.tiny)
    names = [w.name for w in workloads]
    if args.only:
        wanted = args.only.split(",")
        unknown = [n for n in wanted if n not in names]
        if unknown:
            p.error(f"unknown workload(s) {unknown}; choose from {names}")
        names = [n for n in names if n in wanted]
    configs = [c for c in args.configs.split(",") if c]
    bad = [c for c in configs if c not in CONFIGS]
    if bad:
        p.error(f"unknown config(s) {bad}; choose from {list(CONFIGS)}")
    os.makedirs(args.out, exist_ok=True)
    for sub in ("raw", "check"):
        shutil.rmtree(os.path.join(args.out, sub), ignore_errors=True)
    started = time.time()
    log = open(os.path.join(args.out, "log.txt"), "w")
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    jobs = []
    for r in range(args.rounds):
        order = configs[r % len(configs):] + configs[:r % len(configs)]
        jobs += ([(n, c, r) for n in names for c in order] if isolate == "job"
                 else [(",".join(names), c, r) for c in order])
    noise = []
    side = {} if args.no_side else side_measurements(args, log)
    for i, (wl, config, rnd) in enumerate(jobs):
        cache_root = tempfile.mkdtemp(prefix="suite-cache-")
        cmd = [sys.executable, os.path.join(HERE, "suite_worker.py"), "--config", config,
               "--workloads", wl, "--out", args.out, "--repeats", str(repeats),
               "--compile-backend", backend]
        if args.tiny:
            cmd.append("--tiny")
        print(f"[suite] {i + 1}/{len(jobs)} {wl} / {config}"
              + (f" (round {rnd + 1})" if args.rounds > 1 else "") + " ...", end="", flush=True)
        code, wall, others, text = run_job(cmd, job_env(args, cache_root, config),
                                           args.timeout, log)
        shutil.rmtree(cache_root, ignore_errors=True)
        if code != 0:
            mark_crashed(args.out, wl.split(","), config, code, text)
        print(f" {wall:.1f} s" + ("" if code == 0 else f"  (exit {code}: see log.txt)")
              + (f"  [other work kept {others:.1f} cores busy]" if others > 0.2 else ""),
              flush=True)
        noise.append({"job": f"{wl}/{config}", "round": rnd, "wall_s": wall,
                      "other_cores_busy": others})
        if args.rounds > 1:
            for name in wl.split(","):
                raw = os.path.join(args.out, "raw", f"{name}__{config}.json")
                if os.path.exists(raw):
                    os.replace(raw, raw[:-len(".json")] + f".round{rnd}.json")
    if args.rounds > 1:
        merge_rounds(args.out, names, configs, args.rounds)
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
        "commit": git_commit(), "tiny": args.tiny, "repeats": repeats, "isolate": isolate,
        "rounds": args.rounds,
        "compile_backend": backend,
        "cold_caches": not args.warm_caches, "total_s": time.time() - started,
        "noise": noise,
        "max_other_cores_busy": max((n["other_cores_busy"] for n in noise), default=0.0),
    }
    report = suite_report.build(args.out, workloads, names, configs, meta, side)
    suite_report.write_all(args.out, report)
    print(suite_report.text_tables(report))
    print(f"[suite] wrote {args.out}/results.json, results.md, results.png "
          f"in {meta['total_s']:.0f} s")


if __name__ == "__main__":
    main()
