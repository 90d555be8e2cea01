"""robust.py's report: a cell's line (ratios, warm-up curves, bit check), the warm-up
check, and the summary over all cells (worst cell, medians, cells below 0.95, noisy cells,
bit mismatches)."""

from __future__ import annotations

import statistics

from robust_programs import MIB

SLOW_RATIO = 0.95
WARMUP_SLACK = 1.5
NOISY_CORES = 0.3  # other work keeping more cores busy than this marks a cell noisy


def warmup_violations(runs: dict) -> list[str]:
    """Adaptive's first and early windows against its own steady state (x1.5) and against
    eager's same window."""
    out = []
    for c in ("cold", "warm"):
        r = runs[c]
        for w in ("first_ms", "early_ms"):
            v, e = r[w], runs["eager"][w]
            if v is None:
                continue
            if v > WARMUP_SLACK * r["steady_ms"]:
                out.append(f"{c} {w[:-3]} {v:.3g} ms > {WARMUP_SLACK}x steady {r['steady_ms']:.3g}")
            if v > e:
                out.append(f"{c} {w[:-3]} {v:.3g} ms > eager's {e:.3g}")
    return out


def fmt_curve(r: dict) -> str:
    early = "-" if r["early_ms"] is None else f"{r['early_ms']:.3g}"
    return f"{r['first_ms']:.3g}/{early}/{r['steady_ms']:.3g}"


def print_row(row: dict, total: int) -> None:
    head = f"cell {row['index']} of {total}: {row['name']}"
    if "error" in row:
        print(f"{head}: ERROR {row['error'][:600]}", flush=True)
        return
    r = row["runs"]
    bits = "bits ok" if row["bit_equal"] else "BIT MISMATCH " + "; ".join(
        f"{c}: {b['detail']}" for c, b in row["bits"].items() if not b["equal"])
    print(f"{head}\n    ms/iter cpu {r['cpu']['steady_ms']:.3g} eager {r['eager']['steady_ms']:.3g} "
          f"adaptive {r['cold']['steady_ms']:.3g} (warm {r['warm']['steady_ms']:.3g})  "
          f"adaptive/eager {row['adaptive_vs_eager']:.2f}x (warm {row['warm_vs_eager']:.2f}x)  "
          f"adaptive/CPU {row['adaptive_vs_cpu']:.2f}x (warm {row['warm_vs_cpu']:.2f}x)\n"
          f"    warm-up first/early/steady ms: eager {fmt_curve(r['eager'])}  "
          f"cold {fmt_curve(r['cold'])}  warm {fmt_curve(r['warm'])}  "
          f"{'ok' if not row['warmup_violations'] else 'SLOW START'}  {bits}"
          + (f"\n    re-measured, {len(row['rounds_ms'])} rounds: adaptive/eager "
             + " ".join(f"{r['eager'] / r['cold']:.2f}" for r in row["rounds_ms"])
             + f" -> median {row['adaptive_vs_eager']:.2f}x (warm "
             + " ".join(f"{r['eager'] / r['warm']:.2f}" for r in row["rounds_ms"])
             + f" -> {row['warm_vs_eager']:.2f}x)" if "rounds_ms" in row else "")
          + (f"\n    [re-measuring failed: {row['confirm_error'][:300]}]"
             if "confirm_error" in row else "")
          + (f"\n    [noisy: other work kept {row['other_cores_busy']:.1f} cores busy]"
             if row["noisy"] else "")
          + ("\n    [the package was reinstalled between this cell's processes]"
             if len(row["builds"]) > 1 else ""), flush=True)


def summarize(rows: list[dict], seed: int) -> dict:
    good = [r for r in rows if "error" not in r]
    s = {"cells": len(rows), "failed": [r["name"] for r in rows if "error" in r]}
    if good:
        worst = min(good, key=lambda r: r["adaptive_vs_eager"])
        big = [r["adaptive_vs_eager"] for r in good if r["size"] > MIB]
        quiet = [r["adaptive_vs_eager"] for r in good if not r["noisy"]]
        s.update(
            noisy=[r["index"] for r in good if r["noisy"]],
            median_adaptive_vs_eager_quiet=statistics.median(quiet) if quiet else None,
            worst={"cell": worst["index"], "name": worst["name"],
                   "adaptive_vs_eager": worst["adaptive_vs_eager"]},
            worst_warm=min(r["warm_vs_eager"] for r in good),
            median_adaptive_vs_eager=statistics.median(r["adaptive_vs_eager"] for r in good),
            median_adaptive_vs_eager_over_1mib=statistics.median(big) if big else None,
            median_adaptive_vs_cpu=statistics.median(r["adaptive_vs_cpu"] for r in good),
            below_095=[r["index"] for r in good if r["adaptive_vs_eager"] < SLOW_RATIO],
            remeasured={r["index"]: [round(r["first_adaptive_vs_eager"], 3),
                                     round(r["adaptive_vs_eager"], 3)]
                        for r in good if "rounds_ms" in r},
            warmup_violations={r["index"]: r["warmup_violations"] for r in good
                               if r["warmup_violations"]},
            bit_mismatches=[{"seed": seed, "cell": r["index"], "name": r["name"],
                             "configs": {c: b["detail"] for c, b in r["bits"].items()
                                         if not b["equal"]}}
                            for r in good if not r["bit_equal"]])
    return s


def print_summary(s: dict, seed: int) -> None:
    print(f"\n== robust.py seed {seed}: {s['cells']} cells "
          f"({len(s['failed'])} failed{': ' + ', '.join(s['failed']) if s['failed'] else ''})")
    if "worst" not in s:
        return
    w = s["worst"]
    big = s["median_adaptive_vs_eager_over_1mib"]
    print(f"worst cell (adaptive/eager, cold): {w['adaptive_vs_eager']:.2f}x  "
          f"cell {w['cell']} ({w['name']}); worst warm {s['worst_warm']:.2f}x")
    print(f"median adaptive/eager {s['median_adaptive_vs_eager']:.2f}x; over cells > 1 MiB "
          f"{'n/a' if big is None else f'{big:.2f}x'}; median adaptive/CPU "
          f"{s['median_adaptive_vs_cpu']:.2f}x")
    print(f"cells below {SLOW_RATIO}: {len(s['below_095'])} {s['below_095']}")
    if s["remeasured"]:
        print("re-measured (first round -> median of rounds): " + ", ".join(
            f"cell {i} {a:.2f}->{b:.2f}x" for i, (a, b) in s["remeasured"].items()))
    if s["noisy"]:
        q = s["median_adaptive_vs_eager_quiet"]
        print(f"noisy cells (other work kept > {NOISY_CORES} cores busy during a process): "
              f"{len(s['noisy'])} {s['noisy']}; median adaptive/eager without them "
              f"{'n/a' if q is None else f'{q:.2f}x'}")
    print(f"warm-up check (first/early window > {WARMUP_SLACK}x own steady or > eager's): "
          f"{len(s['warmup_violations'])} cells" + ("" if not s["warmup_violations"] else ":"))
    for i, v in s["warmup_violations"].items():
        print(f"    cell {i}: " + "; ".join(v))
    if s["bit_mismatches"]:
        for m in s["bit_mismatches"]:
            print(f"BIT MISMATCH seed {m['seed']} cell {m['cell']} ({m['name']}): {m['configs']}")
    else:
        print("every result equals CPU eager bit for bit")
