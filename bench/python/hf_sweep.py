"""Architecture sweep (issue 24 item 3): every causal LM of the installed transformers, from a
tiny random config, on `neuron` eager and adaptive against CPU eager (bench/python/hf_archs.py
says what one check is). Prints a table per architecture and mode, the pass rate over the
architectures whose CPU run works, and every failure with its reason.

    python bench/python/hf_sweep.py                      # all architectures, eager and adaptive
    python bench/python/hf_sweep.py --modes eager --only llama,mixtral
    python bench/python/hf_sweep.py --out sweep.json     # also write the rows as JSON

Each mode runs in a worker process (NEURON_EAGER_MODE set before torch loads); a worker that
dies (a crash, or one architecture over --timeout seconds) is restarted after the
architecture it was on, which is recorded as a failure.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def worker(names, timeout):
    import warnings

    warnings.filterwarnings("ignore")
    sys.path.insert(0, HERE)
    import hf_archs
    import transformers

    transformers.logging.set_verbosity_error()
    classes = dict(hf_archs.architectures())

    def expired(*_):
        raise TimeoutError(f"over {timeout} s")

    signal.signal(signal.SIGALRM, expired)
    for name in names:
        print(json.dumps({"start": name}), flush=True)
        start = time.time()
        signal.alarm(timeout)
        try:
            status, detail = hf_archs.check(name, classes[name])
        except TimeoutError as error:
            status, detail = "FAIL", f"timeout: {error}"
        finally:
            signal.alarm(0)
        hf_archs.release()
        print(json.dumps({"arch": name, "status": status, "detail": detail,
                          "seconds": round(time.time() - start, 2)}), flush=True)


def run_mode(mode, names, timeout, per_worker=25):
    rows, left = {}, list(names)
    while left:
        env = dict(os.environ, NEURON_EAGER_MODE=mode)
        # A fresh worker every `per_worker` architectures bounds what one process holds.
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--timeout", str(timeout),
               "--only", ",".join(left[:per_worker])]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                text=True)
        current = None
        for line in proc.stdout:
            if not line.startswith("{"):
                continue
            msg = json.loads(line)
            if "start" in msg:
                current = msg["start"]
                continue
            rows[msg["arch"]] = msg
            print(f"  {mode:8s} {msg['arch']:30s} {msg['status']:7s} {msg['seconds']:6.1f}s "
                  f"{msg['detail']}", flush=True)
            current = None
        proc.wait()
        if current is not None:  # the worker died inside this architecture
            rows[current] = {"arch": current, "status": "FAIL", "seconds": 0.0,
                             "detail": f"worker died (exit {proc.returncode})"}
            print(f"  {mode:8s} {current:30s} FAIL    worker died (exit {proc.returncode})", flush=True)
        if current is None and proc.returncode != 0:  # exited between architectures
            for n in left[:per_worker]:
                rows.setdefault(n, {"arch": n, "status": "FAIL", "seconds": 0.0,
                                    "detail": f"worker exited (exit {proc.returncode}) before it"})
        left = [n for n in names if n not in rows]
    return rows


def report(results, modes, names):
    print()
    print("| architecture | " + " | ".join(modes) + " |")
    print("|---|" + "---|" * len(modes))
    for n in names:
        cells = []
        for m in modes:
            r = results[m][n]
            cells.append(r["status"] + (f": {r['detail']}" if r["status"] != "pass" and r["detail"] else ""))
        print(f"| {n} | " + " | ".join(cells) + " |")
    print()
    for m in modes:
        rows = results[m].values()
        tried = [r for r in rows if r["status"] != "skipped"]
        passed = [r for r in tried if r["status"] == "pass"]
        skipped = len(rows) - len(tried)
        rate = 100.0 * len(passed) / max(1, len(tried))
        print(f"{m}: {len(passed)}/{len(tried)} pass ({rate:.1f}%) of the architectures whose CPU run "
              f"works; {skipped} of {len(rows)} skipped (no tiny build or no CPU run)")
        for r in tried:
            if r["status"] != "pass":
                print(f"  FAIL {r['arch']}: {r['detail']}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", default="eager,adaptive")
    p.add_argument("--only", default="", help="comma-separated model types")
    p.add_argument("--timeout", type=int, default=60, help="seconds per architecture")
    p.add_argument("--out", default="", help="write all rows as JSON here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker([n for n in args.only.split(",") if n], args.timeout)
    os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "1")
    sys.path.insert(0, HERE)
    import hf_archs

    names = [n for n, _ in hf_archs.architectures()]
    if args.only:
        wanted = set(args.only.split(","))
        names = [n for n in names if n in wanted]
    modes = [m for m in args.modes.split(",") if m]
    results = {}
    for mode in modes:
        print(f"[{mode}] {len(names)} architectures", flush=True)
        results[mode] = run_mode(mode, names, args.timeout)
    report(results, modes, names)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
