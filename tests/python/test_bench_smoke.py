"""The benchmark scripts run end to end at tiny sizes and write their outputs (no timing
assertions: figures come from bench/, not from tests)."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(script, *args):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "python", script), *args],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def test_tiny_op_bench(tmp_path):
    out = tmp_path / "tiny.json"
    run("tiny_op.py", "--ops", "2000", "--repeats", "1", "--json", str(out))
    res = json.loads(out.read_text())
    assert res["cpu_eager_us_per_op"] > 0 and res["host_cost_ratio"] > 0


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
