"""The benchmark scripts run end to end at tiny sizes and write their outputs (no timing
assertions: figures come from bench/, not from tests)."""

import json
import os
import subprocess
import sys
import warnings

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(script, *args):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "python", script), *args],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (f"{script} exited {r.returncode}\n--- stdout (tail)\n"
                               f"{r.stdout[-3000:]}\n--- stderr (tail)\n{r.stderr[-2000:]}")
    return r.stdout


def test_tiny_op_bench(tmp_path):
    out = tmp_path / "tiny.json"
    run("tiny_op.py", "--ops", "2000", "--repeats", "1", "--json", str(out))
    res = json.loads(out.read_text())
    assert res["cpu_eager_us_per_op"] > 0 and res["host_cost_ratio"] > 0


def test_tiny_op_instructions_bench(tmp_path):
    out = tmp_path / "instr.json"
    text = run("tiny_op_instr.py", "--ops", "300", "--json", str(out))
    res = json.loads(out.read_text())
    # The host thread ran at least the adds' Python and dispatch; neuron's worker ran the
    # kernels, CPU eager has no other busy thread.
    for device in ("cpu", "neuron"):
        assert res[device]["host_instructions_per_op"] > 1000
    assert res["neuron"]["other_threads_instructions_per_op"] > 1000
    assert res["host_ratio"] > 0 and "neuron / CPU eager, host thread" in text


def test_step_instructions_bench(tmp_path):
    out = tmp_path / "step_instr.json"
    text = run("step_instr.py", "chain_small", "eager", "adaptive", "--tiny", "--steps", "2",
               "--json", str(out))
    res = json.loads(out.read_text())
    # Both configs ran the chain's Python and dispatch on the host thread and its kernels
    # on the worker; ratios are against the first config.
    for config in ("eager", "adaptive"):
        r = res["configs"][config]
        assert r["host_instructions_per_step"] > 10000, r
        assert r["other_threads_instructions_per_step"] > 1000, r
    assert res["configs"]["eager"]["host_ratio"] == 1.0
    assert "host thread against eager" in text


def test_trace_overhead_bench(tmp_path):
    out = tmp_path / "trace.json"
    run("trace_overhead.py", "--steps", "3", "--repeats", "1", "--json", str(out))
    res = json.loads(out.read_text())
    assert res["bytes_per_op"] > 0 and res["overhead_ratio"] > 0


def test_adaptive_bench(tmp_path):
    out = tmp_path / "adaptive.json"
    text = run("adaptive.py", "--tiny", "--json", str(out))
    res = json.loads(out.read_text())
    assert set(res) == {"chain small", "adamw", "mlp step"}
    assert all(row["adaptive_ms"] > 0 for row in res.values())
    assert "adapt/cpu" in text


def test_suite_tiny(tmp_path):
    """The suite at --tiny size: every workload under every config runs, matches CPU eager,
    and lands in the JSON, the Markdown table and the PNG chart."""
    pytest.importorskip("matplotlib", reason="the suite draws its chart with matplotlib")
    pytest.importorskip("transformers", reason="the Llama workloads need transformers")
    sys.path.insert(0, os.path.join(ROOT, "bench", "python"))
    from suite_workloads import all_workloads
    from suite_worker import CONFIGS

    run("suite.py", "--tiny", "--repeats", "1", "--out", str(tmp_path))
    report = json.loads((tmp_path / "results.json").read_text())
    names = [w.name for w in all_workloads(tiny=True)]
    assert list(report["workloads"]) == names
    for name, row in report["workloads"].items():
        for config in CONFIGS:
            fig = row["configs"][config]
            assert fig.get("ok"), (name, config, fig.get("error"))
            assert fig["median_ms"] > 0 and fig["first_call_ms"] > 0
        for config, check in row["checks"].items():
            assert check["ok"] is True, (name, config, check["detail"])
    assert report["workloads"]["warmup"]["configs"]["adaptive"]["per_call_ms"]
    assert report["bandwidth"]["machine_gbs"] > 0 and report["tiny_op"]["host_cost_ratio"] > 0
    assert report["chain_floor"]["ln+gelu+add"] > 0, report["chain_floor"]
    statuses = {t["status"] for t in report["targets"]}
    assert statuses <= {"PASS", "MISS", "n/a"} and len(report["targets"]) >= 10
    md = (tmp_path / "results.md").read_text()
    assert all(f"| {n}: " in md for n in names) and "## Targets" in md
    assert "Compute floor of the chain's ATen kernels" in md
    png = (tmp_path / "results.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_chain_bound_bench(tmp_path):
    """The DRAM chain's bound: per size, CPU and adaptive figures, and the compute floor."""
    out = tmp_path / "bound.json"
    text = run("chain_bound.py", "--tiny", "--rounds", "1", "--repeats", "1", "--json", str(out))
    res = json.loads(out.read_text())
    assert set(res["shapes"]) == {"small", "cache", "dram"} and res["stream_copy_gbs"] > 0
    for row in res["shapes"].values():
        assert set(row["floor_kernels_1thread"]) == {"layer_norm", "gelu", "add", "ln+gelu+add"}
        assert all(ns > 0 for ns in row["floor_kernels_1thread"].values())
        for part in ("cpu", "adaptive", "floor"):
            assert row[part]["ns_per_element"] > 0 and row[part]["gbs"] > 0
        assert row["ceiling_vs_cpu"] > 0 and row["adaptive_vs_cpu"] > 0
        assert 1 <= row["tile"][0] <= row["rows"]
    assert "compute floor" in text and "DRAM chain" in text
    bad = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "python", "chain_bound.py"),
                          "--floor", "32by4096"], capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "expected ROWSxCOLS" in bad.stderr


def test_host_bound_bench(tmp_path):
    out = tmp_path / "bound.json"
    text = run("host_bound.py", "--tiny", "--only", "chain_small,adamw", "--json", str(out))
    res = json.loads(out.read_text())
    assert set(res) == {"chain_small", "adamw"}
    for row in res.values():
        assert row["cpu"]["step_ms"] > 0
        for config in ("eager", "adaptive"):
            assert 0 < row[config]["host_ms"] <= row[config]["step_ms"]
            assert row[config]["ceiling_vs_cpu"] > 0
            # Busy only while a step's items ran: more than nothing, at most the step
            # (both means over the timed steps).
            assert 0 < row[config]["device_busy_ms"] <= row[config]["step_mean_ms"]
            assert row[config]["device_ceiling_vs_cpu"] > 0
    assert "ceiling/CPU" in text and "device ceiling/CPU" in text


def test_suite_rounds_keep_each_jobs_median_round(tmp_path):
    """--rounds N: every job runs N times; the round with the median step time stands for
    the job (all rounds kept), and a failed round fails the job."""
    sys.path.insert(0, os.path.join(ROOT, "bench", "python"))
    import suite

    raw = tmp_path / "raw"
    raw.mkdir()
    for r, (a, b) in enumerate([(3.0, 1.0), (1.0, 2.0), (2.0, 9.0)]):
        (raw / f"w__cpu.round{r}.json").write_text(json.dumps({"ok": True, "median_ms": a, "r": r}))
        (raw / f"w__eager.round{r}.json").write_text(
            json.dumps({"ok": r != 1, "median_ms": b, "error": "boom"}))
    suite.merge_rounds(str(tmp_path), ["w"], ["cpu", "eager"], 3)
    cpu = json.loads((raw / "w__cpu.json").read_text())
    assert cpu["median_ms"] == 2.0 and cpu["r"] == 2 and cpu["rounds_ms"] == [3.0, 1.0, 2.0]
    eager = json.loads((raw / "w__eager.json").read_text())
    assert eager["ok"] is False


def test_omp_teams_bench():
    text = run("omp_teams.py", "--size", "8,16,16", "--calls", "20", "--repeats", "1")
    lines = [l for l in text.splitlines() if l.startswith("2-thread mm 8x16x16")]
    assert len(lines) == 3 and "x the main thread" in lines[2], text


def test_policy_ab_bench():
    text = run("policy_ab.py", "chain_small", "--tiny", "min_group_elements=0",
               "aggressive", "eager", "--rounds", "2", "--steps", "2", "--warmup", "4")
    lines = [l for l in text.splitlines() if "median" in l]
    assert [l.split()[0] for l in lines] == ["min_group_elements=0", "aggressive", "eager"], text
    assert all(float(l.split()[2]) > 0 for l in lines), text


def test_paired_bench(tmp_path):
    out = tmp_path / "paired.json"
    text = run("paired.py", "mlp_train", "--tiny", "cpu", "adaptive:NEURON_SYNC_YIELD_US=0",
               "--rounds", "3", "--block-s", "0.02", "--gap-s", "0", "--json", str(out))
    data = json.loads(out.read_text())
    assert list(data["configs"]) == ["cpu", "adaptive:NEURON_SYNC_YIELD_US=0"], text
    assert data["configs"]["cpu"]["speedup"] == 1.0
    assert data["configs"]["adaptive:NEURON_SYNC_YIELD_US=0"]["median_ms"] > 0, text


def test_paired_bench_rejects_a_bad_config():
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "python", "paired.py"), "mlp_train", "gpu"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "unknown config 'gpu'" in proc.stderr, proc.stderr


def test_robust_tiny(tmp_path):
    """robust.py --tiny: its three cells ran in all four processes, every neuron result
    equals CPU eager's bit for bit, and the figures and the summary are there."""
    out = tmp_path / "robust.json"
    text = run("robust.py", "--tiny", "--json", str(out))
    res = json.loads(out.read_text())
    cells = res["cells"]
    assert [c.get("workload") for c in cells] == [None, None, "mlp"], [c["name"] for c in cells]
    assert [c["reads"] for c in cells] == [1, 10, 1]
    for c in cells:
        assert "error" not in c, c["error"]
        assert set(c["runs"]) == {"cpu", "eager", "cold", "warm"}
        assert c["bit_equal"] is True and all(b["equal"] for b in c["bits"].values()), c["bits"]
        for r in c["runs"].values():
            assert r["steady_ms"] > 0 and r["first_ms"] > 0 and r["early_ms"] > 0
            assert r["marks"][-1][0] == c["plan"]["iters"]
        assert c["adaptive_vs_eager"] > 0 and c["adaptive_vs_cpu"] > 0
    # The generated programs are the documented ones: every op kind, then a mixed one.
    assert cells[0]["program"]["flavor"] == "all" and cells[0]["program"]["shapes"] == "every_k"
    assert len(cells[0]["program"]["ops"]) >= 20
    s = res["summary"]
    assert s["cells"] == 3 and not s["failed"] and s["bit_mismatches"] == []
    assert 0 < s["worst"]["adaptive_vs_eager"] <= s["median_adaptive_vs_eager"]
    assert "every result equals CPU eager bit for bit" in text and "worst cell" in text


def test_robust_rejects_bad_options():
    script = os.path.join(ROOT, "bench", "python", "robust.py")
    for args, message in ((["--sizes", "3K"], "out of range"),
                          (["--sizes", "20K"], "not a multiple of 16K"),
                          (["--workloads", "gpu"], "unknown gpu"),
                          (["--reads", "1,x"], "--reads")):
        proc = subprocess.run([sys.executable, script, *args], capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 2 and message in proc.stderr, (args, proc.stderr)
        assert proc.stderr.count("error:") == 1, proc.stderr


def test_queue_depth_tiny(tmp_path):
    """queue_depth.py --tiny: every (mode, read interval) process ran, the ratios against
    a read every iteration are there, and every process read the same bits as CPU eager."""
    out = tmp_path / "qd.json"
    text = run("queue_depth.py", "--tiny", "--json", str(out))
    res = json.loads(out.read_text())
    for retry in res["retries"]:  # a child that failed once, then ran: shown, not fatal
        warnings.warn(f"queue_depth.py child {retry['mode']} every {retry['reads']} failed "
                      f"once: {retry['error'][-1500:]}")
    assert res["reads"] == [1, 10, 50] and res["failed"] == []
    cpu = res["results"]["cpu"]["1"]
    for mode in ("eager", "adaptive"):
        for r in ("1", "10", "50"):
            fig = res["results"][mode][r]
            assert fig["ok"] and fig["ms_per_iter"] > 0, fig
            assert fig["peak_rss"] >= fig["rss_before_loop"] > 0
            assert fig["max_memory_allocated"] > 0 and fig["peak_reserved"] > 0
            assert fig["last_read"] == cpu["last_read"], (mode, r)
        assert set(res["ratios"][mode]) == {"10", "50"}
        assert all(v["time"] > 0 and v["peak_rss"] > 0 for v in res["ratios"][mode].values())
    assert "every 50 / every 1" in text
    bad = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "python", "queue_depth.py"),
                          "--reads", "1,7", "--iters", "100"], capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "multiple of every read interval" in bad.stderr, bad.stderr


def test_fuzz_bench_and_replay(tmp_path):
    """fuzz.py compares random tier-2 programs with CPU in batches (its own processes and
    cache) and prints a summary; --only replays one program of a batch."""
    out = tmp_path / "fuzz.json"
    text = run("fuzz.py", "--programs", "2", "--batch", "2", "--kinds", "pointwise", "--seed", "3",
               "--tiers", "native", "--cache-dir", str(tmp_path / "cache"), "--json", str(out))
    res = json.loads(out.read_text())
    assert res["kinds"]["pointwise/native"]["programs"] == 2 and res["mismatches"] == []
    assert res["failed_batches"] == [] and "2 programs compared" in text and " 0 mismatches" in text
    assert res["kinds"]["pointwise/native"]["counters"]["native_built"] >= 1
    one = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "python", "native_diff.py"),
                          "--programs", "2", "--seed", str(3 * 100003), "--only", "1"],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "NEURON_CACHE_DIR": str(tmp_path / "cache")})
    assert one.returncode == 0, one.stderr[-1500:]
    assert json.loads(one.stdout.strip().splitlines()[-1])["programs"] == 1
    bad = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "python", "fuzz.py"),
                          "--kinds", "nope"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "allowed pointwise, rows" in bad.stderr
    bad = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "python", "fuzz.py"),
                          "--tiers", "eager,fast"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "allowed eager, instant, native" in bad.stderr


def test_fuzz_few_hundred_programs_eager_and_tier1(tmp_path):
    """CI's share of fuzzing at scale: 240 programs of each kind per-op eager and fused by
    tier 1 (no compiler: seconds per batch), every one equal to CPU eager, and tier 1
    really fusing them."""
    out = tmp_path / "fuzz.json"
    text = run("fuzz.py", "--programs", "240", "--tiers", "eager,instant", "--seed", "11",
               "--cache-dir", str(tmp_path / "cache"), "--json", str(out))
    res = json.loads(out.read_text())
    assert res["mismatches"] == [] and res["failed_batches"] == [], text[-2000:]
    for kind in ("pointwise", "rows"):
        for tier in ("eager", "instant"):
            assert res["kinds"][f"{kind}/{tier}"]["programs"] == 240
        assert res["kinds"][f"{kind}/instant"]["counters"]["ops_in_tile_groups"] > 1000
        assert res["kinds"][f"{kind}/eager"]["counters"]["ops_in_tile_groups"] == 0


def test_soak_short(tmp_path):
    """soak.py for a quarter minute: samples over time (RSS, device memory, cache entries,
    key table, compiles), CSV and plot written, the CPU twin equal at every sample."""
    out, csv, png = tmp_path / "soak.json", tmp_path / "soak.csv", tmp_path / "soak.png"
    text = run("soak.py", "--minutes", "0.25", "--interval", "4", "--shape-every", "10",
               "--json", str(out), "--csv", str(csv), "--plot", str(png))
    res = json.loads(out.read_text())
    assert res["mismatches"] == 0 and res["samples"] >= 3 and res["steps"] > 0
    series = res["series"]
    assert all(s["equal"] for s in series) and series[-1]["keys"] > 0 and series[-1]["programs"] > 0
    assert series[-1]["rss_mb"] > 0 and series[-1]["reserved_mb"] > 0
    assert csv.read_text().splitlines()[0].startswith("t_s,steps,rss_mb")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "per 10 min" in text
