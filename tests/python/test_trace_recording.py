"""Recording a real workload: an MLP training loop on `neuron`, traced, loaded back,
summarised and exported (the synthetic-file checks live in test_trace_viewer.py)."""

import json
import os
import subprocess
import sys

import pytest

import torch
import torch.nn as nn

import neuron_eager
import neuron_eager.trace as nt
from neuron_eager.trace import summarize
from test_trace_viewer import check_chrome_trace

STEPS = 12


def train(steps):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32), nn.ReLU(),
                          nn.Linear(32, 4)).to("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    x = torch.randn(8, 16).to("neuron")
    y = torch.randint(0, 4, (8,)).to("neuron")
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())  # one host sync per step, cause "item"
    return losses


def test_mlp_loop_trace_counts_keys_and_syncs(tmp_path):
    path = tmp_path / "mlp.ntrace"
    neuron_eager.reset_counters()
    with nt.record(path):
        train(STEPS)
    trace = nt.load(path)
    kinds = trace.events["kind"]
    dispatched = int((kinds == 1).sum())
    executed = int((kinds == 2).sum())
    assert dispatched > 20 * STEPS
    assert executed == dispatched  # every queued op ran, and each is in the trace once
    s = summarize(trace)
    assert sum(op.calls for op in s.ops) == dispatched
    by_name = {op.name: op for op in s.ops}
    assert by_name["aten::addmm"].calls == 3 * STEPS  # three Linear layers per forward
    assert by_name["aten::addmm"].device_total_ns > 0
    # The loop body recurs: its segments are hit again and again.
    assert s.segments, "no segments recorded"
    top = max(s.segments, key=lambda seg: seg.count)
    assert top.count >= STEPS - 1
    assert top.hits >= STEPS - 2
    # One `.item()` per step: syncs by cause, with the Python stack of the first one.
    item = next(sync for sync in s.syncs if sync.cause == "item")
    assert item.count == STEPS
    assert "test_trace_recording.py" in item.stack
    assert trace.metadata["mode"] == neuron_eager.get_mode()
    assert trace.metadata["policy"]["hot_threshold"] == neuron_eager.get_policy()["hot_threshold"]


def test_mlp_loop_perfetto_export_validates(tmp_path):
    path = tmp_path / "mlp.ntrace"
    with nt.record(path):
        train(4)
    out = tmp_path / "mlp.json"
    r = subprocess.run([sys.executable, "-m", "neuron_eager.trace.cli", "perfetto", str(path),
                        "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    by, names = check_chrome_trace(json.loads(out.read_text()))
    assert any(n.startswith("host") for n in names.values())
    assert any(n.startswith("worker") for n in names.values())
    assert len(by["s"]) == len(by["f"]) > 0  # dispatch -> execute flow arrows
    assert by["C"], "no memory or queue counters"


def test_neuron_trace_env_writes_a_trace_at_exit(tmp_path):
    path = tmp_path / "env.ntrace"
    code = ("import torch\n"
            "x = torch.ones(64, device='neuron')\n"
            "for _ in range(5): x = x * 2 + 1\n"
            "print(x.sum().item())\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**__import__("os").environ, "NEURON_TRACE": str(path)})
    assert r.returncode == 0, r.stderr
    trace = nt.load(path)
    assert int((trace.events["kind"] == 1).sum()) >= 10


@pytest.mark.parametrize("name, env, expected", [
    ("run.ntrace", {"RANK": "1", "WORLD_SIZE": "2"}, "run.rank1.ntrace"),  # torchrun: one file per rank
    ("run", {"RANK": "3", "WORLD_SIZE": "4"}, "run.rank3"),
    ("r{rank}.ntrace", {"RANK": "1", "WORLD_SIZE": "2"}, "r1.ntrace"),  # the user placed the rank
    ("run.ntrace", {"RANK": "0", "WORLD_SIZE": "1"}, "run.ntrace"),  # one rank: the path as given
    ("p{pid}.ntrace", {}, None),
])
def test_neuron_trace_path_names_the_rank_or_pid(tmp_path, name, env, expected):
    code = ("import os, torch\n"
            "x = torch.ones(64, device='neuron') * 2\n"
            "print(os.getpid(), x.sum().item())\n")
    full_env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                       env={**full_env, "NEURON_TRACE": str(tmp_path / name), **env})
    assert r.returncode == 0, r.stderr
    if expected is None:
        expected = f"p{r.stdout.split()[0]}.ntrace"
    assert sorted(p.name for p in tmp_path.iterdir()) == [expected]
    assert len(nt.load(tmp_path / expected).events) > 0
