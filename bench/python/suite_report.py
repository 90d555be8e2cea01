"""Turns the suite workers' raw figures into one report: correctness against CPU eager,
ratios, targets (PASS/MISS, never asserted), and the JSON, Markdown and PNG outputs."""

from __future__ import annotations

import json
import os

LABELS = {"cpu": "CPU eager", "eager": "neuron eager", "adaptive": "neuron adaptive",
          "compile": "torch.compile", "compile_neuron": "compile(neuron)"}
# Tolerances against CPU eager after a few steps: the neuron configs run the same ATen
# kernels (fused segments keep to the numerics contract); Inductor reorders arithmetic.
TOLERANCE = {"eager": (1e-4, 1e-5), "adaptive": (1e-4, 1e-5), "compile": (1e-3, 1e-4),
             "compile_neuron": (1e-4, 1e-5)}


def compare(ref, got, exact, rtol, atol):
    import torch

    worst = 0.0
    for k, r in ref.items():
        g = got.get(k)
        if g is None or g.shape != r.shape:
            return False, f"{k}: shape {None if g is None else tuple(g.shape)} != {tuple(r.shape)}"
        if exact:
            if not torch.equal(g, r):
                return False, f"{k}: {int((g != r).sum())} of {r.numel()} elements differ"
            continue
        diff = (g.double() - r.double()).abs()
        worst = max(worst, float(diff.max()) if diff.numel() else 0.0)
        if not torch.allclose(g.double(), r.double(), rtol=rtol, atol=atol):
            return False, f"{k}: max abs diff {float(diff.max()):.3g} (rtol {rtol}, atol {atol})"
    return True, f"max abs diff {worst:.3g}" if not exact else "equal"


def check_results(out, wl, configs):
    import torch

    def load(config):
        path = os.path.join(out, "check", f"{wl.name}__{config}.pt")
        return torch.load(path) if os.path.exists(path) else None

    ref = load("cpu")
    checks = {}
    for config in configs:
        if config == "cpu":
            continue
        got = load(config)
        if ref is None or got is None:
            checks[config] = {"ok": None, "detail": "no result" if got is None else "no CPU reference"}
            continue
        rtol, atol = TOLERANCE[config]
        for phase, res in got.items():
            ok, detail = compare(ref["early"], res, wl.exact, rtol, atol)
            entry = checks.setdefault(config, {"ok": True, "detail": ""})
            entry["ok"] = entry["ok"] and ok
            entry["detail"] += f"{phase}: {detail}; "
    return checks


def ratio(a, b):
    return a / b if a and b else None


def build(out, workloads, names, configs, meta, side):
    rows = {}
    for wl in workloads:
        if wl.name not in names:
            continue
        figs = {}
        for config in configs:
            path = os.path.join(out, "raw", f"{wl.name}__{config}.json")
            figs[config] = json.load(open(path)) if os.path.exists(path) else {
                "ok": False, "error": "no result (worker crashed or timed out: see log.txt)"}
        ms = {c: f.get("median_ms") for c, f in figs.items() if f.get("ok")}
        row = {"title": wl.title, "kind": wl.kind, "configs": figs,
               "checks": check_results(out, wl, configs),
               "speedup_vs_cpu": {c: ratio(ms.get("cpu"), m) for c, m in ms.items()},
               "adaptive_vs_eager": ratio(ms.get("eager"), ms.get("adaptive")),
               "adaptive_vs_compile": ratio(ms.get("compile"), ms.get("adaptive")),
               # torch.compile(backend="neuron") against adaptive's steady state and Inductor
               "compile_neuron_vs_adaptive": ratio(ms.get("adaptive"), ms.get("compile_neuron")),
               "compile_neuron_vs_compile": ratio(ms.get("compile"), ms.get("compile_neuron"))}
        # Compile time: the first call less a steady one (Dynamo, AOTAutograd and the
        # backend's own work before the first result).
        for config, key in (("compile", "compile_time_s"), ("compile_neuron", "compile_neuron_time_s")):
            comp = figs.get(config, {})
            if comp.get("ok"):
                row[key] = (comp["first_call_ms"] - comp["median_ms"]) / 1e3
        if row.get("compile_time_s") and "compile_neuron_time_s" in row:
            row["compile_neuron_time_vs_compile"] = row["compile_neuron_time_s"] / row["compile_time_s"]
        if wl.bytes_moved and ms.get("adaptive"):
            row["adaptive_gbs"] = wl.bytes_moved / (ms["adaptive"] / 1e3) / 1e9
        rows[wl.name] = row
    report = {"meta": meta, **side, "workloads": rows}
    report["targets"] = targets(report)
    return report


def targets(report):
    rows, out = report["workloads"], []

    def add(name, value, goal, fmt="{:.2f}x", higher=True):
        ok = None if value is None else (value >= goal if higher else value <= goal)
        out.append({"target": name, "value": value, "goal": goal, "higher_is_better": higher,
                    "shown": "n/a" if value is None else fmt.format(value),
                    "goal_shown": (">= " if higher else "<= ") + fmt.format(goal),
                    "status": "n/a" if ok is None else ("PASS" if ok else "MISS")})

    for name, row in rows.items():
        if row["kind"] in ("chain", "adamw"):
            add(f"{name}: adaptive / CPU eager", row["speedup_vs_cpu"].get("adaptive"), 2.0)
            add(f"{name}: adaptive / torch.compile", row["adaptive_vs_compile"], 0.8)
        elif row["kind"] in ("train", "decode"):
            add(f"{name}: adaptive / CPU eager", row["speedup_vs_cpu"].get("adaptive"), 1.2)
        if row["kind"] in ("chain", "train", "decode") and "compile_neuron" in row["configs"]:
            # issue 25: compile(neuron) against adaptive's steady state and Inductor, and
            # its compile time against Inductor's
            add(f"{name}: compile(neuron) / adaptive", row.get("compile_neuron_vs_adaptive"), 1.0)
            add(f"{name}: compile(neuron) / torch.compile", row.get("compile_neuron_vs_compile"), 0.8)
            add(f"{name}: compile(neuron) compile time / torch.compile's",
                row.get("compile_neuron_time_vs_compile"), 0.5, higher=False)
        elif row["kind"] == "shapes":
            add(f"{name}: adaptive / neuron eager", row["adaptive_vs_eager"], 0.95)
        elif row["kind"] == "warmup":
            a = row["configs"].get("adaptive", {})
            c = row["configs"].get("compile", {})
            value = (a["warmup_excess_s"] / c["warmup_excess_s"]
                     if a.get("ok") and c.get("ok") and c["warmup_excess_s"] > 0 else None)
            add(f"{name}: adaptive warm-up / torch.compile compile time", value, 0.10,
                fmt="{:.1%}", higher=False)
    dram = rows.get("chain_dram")
    bw = report.get("bandwidth", {}).get("machine_gbs")
    if dram is not None:
        value = dram.get("adaptive_gbs") / bw if dram.get("adaptive_gbs") and bw else None
        add("chain_dram: adaptive GB/s / machine bandwidth", value, 0.70, fmt="{:.0%}")
    tiny = report.get("tiny_op", {})
    add("tiny op host cost: neuron eager / CPU eager", tiny.get("host_cost_ratio"), 1.1,
        higher=False)
    return out


def _ms(f):
    if not f or not f.get("ok"):
        return "ERR"
    return f"{f['median_ms']:.3g} ({f['min_ms']:.3g}-{f['max_ms']:.3g})"


def _x(v):
    return "-" if v is None else f"{v:.2f}x"


def _check(row):
    bad = [c for c, ch in row["checks"].items() if ch["ok"] is False]
    missing = [c for c, ch in row["checks"].items() if ch["ok"] is None]
    return ("WRONG: " + ",".join(bad)) if bad else ("?" + ",".join(missing) if missing else "ok")


def markdown(report):
    meta, rows = report["meta"], report["workloads"]
    configs = [c for c in LABELS if any(c in r["configs"] for r in rows.values())]
    lines = [f"# neuron-eager benchmark suite ({'tiny' if meta['tiny'] else 'full'} sizes)", "",
             f"{meta['date']}, commit {meta['commit']}, {meta['cpus']} CPUs, "
             f"{meta['repeats']} repeats"
             + (f" x {meta['rounds']} rounds (configs rotated; each job's median round)"
                if meta.get("rounds", 1) > 1 else "")
             + ", medians (min-max) in ms per step; ratios are speedups "
             f"(higher is faster), taken within this run; torch.compile backend "
             f"{meta.get('compile_backend', 'inductor')}, compile caches "
             f"{'cold' if meta.get('cold_caches') else 'warm'}.", ""]
    if meta["max_other_cores_busy"] > 0.2:
        lines += [f"**Noisy run:** other work kept up to {meta['max_other_cores_busy']:.1f} "
                  "cores busy during some jobs (see results.json meta.noise).", ""]
    head = ["workload"] + [LABELS[c] for c in configs] + [
        "adaptive/CPU", "adaptive/eager", "adaptive/compile", "compile(neuron)/adaptive",
        "compile(neuron)/compile", "compile time s", "compile(neuron) time s", "fused", "check"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, row in rows.items():
        a = row["configs"].get("adaptive", {})
        cells = [f"{name}: {row['title']}"] + [_ms(row["configs"].get(c)) for c in configs] + [
            _x(row["speedup_vs_cpu"].get("adaptive")), _x(row["adaptive_vs_eager"]),
            _x(row["adaptive_vs_compile"]), _x(row.get("compile_neuron_vs_adaptive")),
            _x(row.get("compile_neuron_vs_compile")),
            f"{row['compile_time_s']:.1f}" if "compile_time_s" in row else "-",
            f"{row['compile_neuron_time_s']:.1f}" if "compile_neuron_time_s" in row else "-",
            f"{a['fused_share']:.0%}" if a.get("fused_share") is not None else "-", _check(row)]
        lines.append("| " + " | ".join(cells) + " |")
    warm = rows.get("warmup")
    if warm:
        lines += ["", "Warm-up (MLP step from the first call): time until steady-state speed, "
                  "and the time spent above steady-state speed getting there.", "",
                  "| config | first call ms | steady ms | steady after steps | time to steady s "
                  "| excess s |", "|---|---|---|---|---|---|"]
        for c, f in warm["configs"].items():
            if f.get("ok"):
                lines.append(f"| {LABELS[c]} | {f['first_call_ms']:.1f} | {f['median_ms']:.2f} "
                             f"| {f['steady_after_steps']} | {f['time_to_steady_s']:.2f} "
                             f"| {f['warmup_excess_s']:.2f} |")
    bw, tiny = report.get("bandwidth", {}), report.get("tiny_op", {})
    lines += [""]
    if "machine_gbs" in bw:
        dram = rows.get("chain_dram", {})
        lines.append(f"Memory bandwidth (roofline): {bw['machine_gbs']:.1f} GB/s "
                     f"(torch copy {bw['torch']['copy_gbs']:.1f}, triad "
                     f"{bw['torch']['triad_gbs']:.1f})"
                     + (f"; DRAM chain, adaptive: {dram['adaptive_gbs']:.1f} GB/s of compulsory "
                        "traffic" if dram.get("adaptive_gbs") else "") + ".")
        floor = report.get("chain_floor", {})
        if "ln+gelu+add" in floor and bw.get("threads"):
            # A block moves 8 bytes per element (read y, write y); tiles share the cores.
            floor_gbs = 8 * bw["threads"] / floor["ln+gelu+add"]
            lines.append(f"Compute floor of the chain's ATen kernels (layer_norm, gelu, add on a "
                         f"cache-resident tile, 1 thread): {floor['ln+gelu+add']:.3f} ns per "
                         f"element, so at most {floor_gbs:.1f} GB/s on {bw['threads']} threads "
                         f"({floor_gbs / bw['machine_gbs']:.0%} of the roofline)"
                         + (f"; the DRAM chain reaches {dram['adaptive_gbs'] / floor_gbs:.0%} of it"
                            if dram.get("adaptive_gbs") else "") + ".")
    if "host_cost_ratio" in tiny:
        lines.append(f"Tiny op (16-element add): CPU eager {tiny['cpu_eager_us_per_op']:.2f} us, "
                     f"neuron eager host cost {tiny['neuron_host_us_per_op']:.2f} us.")
    lines += ["", "## Targets (issue 6)", "", "| target | value | goal | status |",
              "|---|---|---|---|"]
    for t in report["targets"]:
        lines.append(f"| {t['target']} | {t['shown']} | {t['goal_shown']} | {t['status']} |")
    errors = [(n, c, f["error"]) for n, r in rows.items() for c, f in r["configs"].items()
              if not f.get("ok")]
    if errors:
        lines += ["", "## Errors", ""] + [f"- {n} / {c}: {e}" for n, c, e in errors]
    wrong = [(n, c, ch["detail"]) for n, r in rows.items() for c, ch in r["checks"].items()
             if ch["ok"] is False]
    if wrong:
        lines += ["", "## Results that differ from CPU eager", ""] + [
            f"- {n} / {c}: {d}" for n, c, d in wrong]
    return "\n".join(lines) + "\n"


def text_tables(report):
    return markdown(report)


def chart(report, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["workloads"]
    configs = [c for c in LABELS if any(c in r["configs"] for r in rows.values())]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(15, 5.5), gridspec_kw={"width_ratios": [3, 2]})
    names = list(rows)
    width = 0.8 / max(1, len(configs))
    for i, c in enumerate(configs):
        vals = [rows[n]["speedup_vs_cpu"].get(c) or 0 for n in names]
        ax.bar([x + i * width for x in range(len(names))], vals, width, label=LABELS[c])
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_xticks([x + width * (len(configs) - 1) / 2 for x in range(len(names))])
    ax.set_xticklabels(names, rotation=30, ha="right")
    ax.set_ylabel("speedup vs CPU eager (median, log)")
    ax.set_title("steady state")
    ax.legend(fontsize=8)
    warm = rows.get("warmup", {}).get("configs", {})
    for c, f in warm.items():
        if f.get("ok") and f.get("per_call_ms"):
            t, xs = 0.0, []
            for ms in f["per_call_ms"]:
                t += ms / 1e3
                xs.append(t)
            ax2.plot(xs, f["per_call_ms"], marker=".", label=LABELS[c])
    ax2.set_xscale("symlog", linthresh=0.1)
    ax2.set_yscale("log")
    ax2.set_xlabel("seconds since the first call")
    ax2.set_ylabel("ms per step")
    ax2.set_title("warm-up (MLP step)")
    ax2.legend(fontsize=8)
    meta = report["meta"]
    fig.suptitle(f"neuron-eager suite, {meta['date']}, commit {meta['commit']}"
                 + (" (tiny)" if meta["tiny"] else "")
                 + (" - NOISY: other work running" if meta["max_other_cores_busy"] > 0.2 else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_all(out, report):
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(report, f, indent=1)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(markdown(report))
    chart(report, os.path.join(out, "results.png"))
