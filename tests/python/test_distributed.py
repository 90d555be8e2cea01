"""torch.distributed on `neuron`: the "neuron" process-group backend under torchrun.

Each test launches `python -m torch.distributed.run --standalone --nproc_per_node=2` on a
script kept beside this file and checks what its ranks print:
- dist_collectives.py: every collective on neuron tensors bit-equal to the same
  collective on CPU tensors with Gloo (one "cpu:gloo,neuron:neuron" group), the host not
  blocked by a collective its peer has not issued, collectives in traces;
- dist_ddp.py: DDP (init_process_group() with no backend) of an MLP and of a small Llama,
  20 AdamW steps, with and without no_sync (MLP), losses and weights bit-equal to DDP on CPU tensors with Gloo, in eager
  and in adaptive mode (where fused programs must run between the collectives);
- dist_fsdp.py: FSDP2 (fully_shard per layer and whole, on a DeviceMesh) 20 AdamW steps,
  losses and gathered weights bit-equal to FSDP2 on CPU/Gloo; a sharded DTensor matmul;
  tensor parallelism (parallelize_module, column/row-wise); its distributed checkpoint
  loaded in one process (another world size);
- bench/python/tp_fsdp.py: a tiny Llama with tensor parallelism on attention and MLP and
  FSDP2 on a 2-D (dp, tp) mesh, 2 and 4 processes, bit-equal to CPU/Gloo;
- dist_errors.py: bad input gets one clear error, a dead peer an error naming the
  collective at the next sync, mismatched shapes (TORCH_DISTRIBUTED_DEBUG=DETAIL) torch's
  mismatch error on both ranks; nothing hangs (each run has a deadline).
"""

import json
import os
import subprocess
import sys

import pytest
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
DEADLINE_S = 120

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch built without distributed/Gloo")


def torchrun(script, *args, env=None):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           os.path.join(HERE, script), *args]
    full_env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=DEADLINE_S, env=full_env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{script} {args} failed ({proc.returncode}):\n{out[-6000:]}"
    return out


def ok_lines(out):
    return [line[3:] for line in out.splitlines() if line.startswith("OK ")]


def test_collectives_match_gloo_on_cpu():
    out = torchrun("dist_collectives.py")
    done = {line.split()[0] for line in ok_lines(out)}
    expected = {"all_reduce_ops", "all_reduce_ordering", "host_does_not_block", "broadcast_and_reduce", "all_gather_forms",
                "reduce_scatter_forms", "all_to_all_forms", "gather_scatter", "point_to_point", "coalesced",
                "sub_groups", "traced"}
    assert expected <= done, f"missing checks: {expected - done}\n{out[-3000:]}"


@pytest.mark.parametrize("mode", ["eager", "adaptive"])
def test_ddp_matches_gloo_on_cpu(tmp_path, mode):
    report_path = tmp_path / "ddp.json"
    torchrun("dist_ddp.py", str(report_path), env={"NEURON_EAGER_MODE": mode})
    report = json.loads(report_path.read_text())
    assert report["mode"] == mode
    assert report["plain"]["steps"] == 20
    assert report["no_sync"]["steps"] == 15  # every 4th step accumulates under no_sync
    losses = report["plain"]["losses"]
    assert len(set(losses)) > 1 and all(l == l for l in losses)  # the model trains, no NaN
    try:
        import transformers  # noqa: F401
        assert report["llama"]["steps"] == 20  # the small Llama under DDP, bit-equal to CPU/Gloo
    except ImportError:
        pass
    if mode == "adaptive":  # fusion engaged between the collectives (measured: ~1000 of ~3800 ops)
        assert report["counters"]["programs"] > 0 and report["counters"]["ops_in_fused_segments"] > 0, report


def test_fsdp2_dtensor_tp_and_checkpoint(tmp_path):
    done = ok_lines(torchrun("dist_fsdp.py", str(tmp_path)))
    assert done == ["fsdp2", "dtensor", "tensor_parallel"], done
    # The 2-rank sharded checkpoint loads in one process (another world size) on neuron.
    r = subprocess.run([sys.executable, "-c", f"""
import torch, torch.nn as nn, torch.distributed.checkpoint as dcp
model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 10)).to("neuron")
state = model.state_dict()
dcp.load(state, checkpoint_id={str(tmp_path)!r}, no_dist=True)
ref = torch.load({str(tmp_path / "full_weights.pt")!r})
assert sorted(ref) == sorted(state), (sorted(ref), sorted(state))
for k in ref:
    assert state[k].device.type == "neuron" and torch.equal(state[k].cpu(), ref[k]), k
print("LOADED", len(ref))
"""], capture_output=True, text=True, timeout=DEADLINE_S)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "LOADED 6" in r.stdout


def test_bad_input_errors_and_dead_peer():
    out = torchrun("dist_errors.py")
    cases = [line.split(":")[0] for line in ok_lines(out)]
    for case in ("cpu tensor on the neuron group", "neuron tensor on a cpu-only group",
                 "cpu outputs for a neuron input", "non-contiguous tensor", "two cores in one call",
                 "unsupported reduce op", "all_gather_into_tensor output of the wrong size",
                 "all_to_all_single splits that do not add up", "reduce_scatter_tensor dtypes differ",
                 "group usable after errors"):
        assert cases.count(case) == 2, f"{case}: {cases.count(case)} ranks\n{out[-3000:]}"
    assert cases.count("peer died mid-collective") == 1, out[-3000:]


def test_mismatched_shapes_fail_on_both_ranks():
    out = torchrun("dist_errors.py", "mismatch", env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    assert [line.split(":")[0] for line in ok_lines(out)].count("shapes differ across ranks") == 2, out[-3000:]


def _run_py(code, **env):
    full = {k: v for k, v in os.environ.items() if not k.startswith("NEURON_") or k == "NEURON_CACHE_DIR"}
    full.update(env)
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("visible,cores,count", [("1", "2", 1), ("0-1,3", "4", 3)])
def test_visible_cores(visible, cores, count):
    r = _run_py("import torch; print('N', torch.neuron.device_count(), (torch.ones(2, device=f'neuron:{torch.neuron.device_count() - 1}') * 2).sum().item())",
                NEURON_RT_VISIBLE_CORES=visible, NEURON_CORES=cores)
    assert r.returncode == 0, r.stderr
    assert f"N {count} 4.0" in r.stdout


@pytest.mark.parametrize("local_rank,cores,visible,expected", [
    ("1", "2", None, 1), ("3", "2", None, 1), ("0", "2", None, 0),
    ("3", "4", "1-2", 1),  # two visible cores: LOCAL_RANK 3 -> neuron:1
    ("1", "4", "2", 0),    # one visible core (accelerate's way): always neuron:0
    ("x", "2", None, 0),   # not torchrun's number: ignored
])
def test_local_rank_picks_the_default_core(local_rank, cores, visible, expected):
    """Under torchrun each rank uses core LOCAL_RANK % device_count() unless it sets one,
    on every thread (a new thread too)."""
    env = {"LOCAL_RANK": local_rank, "NEURON_CORES": cores}
    if visible:
        env["NEURON_RT_VISIBLE_CORES"] = visible
    r = _run_py("import torch, threading\n"
                "seen = []\n"
                "t = threading.Thread(target=lambda: seen.append(torch.ones(1, device='neuron').device.index))\n"
                "t.start(); t.join()\n"
                "print('D', torch.neuron.current_device(), torch.ones(1, device='neuron').device.index, seen[0])\n"
                "torch.neuron.set_device(0); print('S', torch.ones(1, device='neuron').device.index)", **env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"D {expected} {expected} {expected}" in r.stdout and "S 0" in r.stdout, r.stdout


@pytest.mark.parametrize("visible", ["2", "0,0", "1-0,"])
def test_visible_cores_bad_values(visible):
    r = _run_py("import torch", NEURON_RT_VISIBLE_CORES=visible, NEURON_CORES="2")
    assert r.returncode != 0
    assert "NEURON_RT_VISIBLE_CORES" in r.stderr and "below NEURON_CORES (2)" in r.stderr, r.stderr[-2000:]


def test_benches_run_tiny(tmp_path):
    """bench/python/collectives.py and ddp_overlap.py run end to end (figures, no timing asserted)."""
    bench = os.path.join(os.path.dirname(os.path.dirname(HERE)), "bench", "python")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, os.path.join(bench, "collectives.py"), "--sizes", "4K,16K", "--rounds", "1",
                        "--out", str(tmp_path / "c.json")], capture_output=True, text=True, timeout=DEADLINE_S, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads((tmp_path / "c.json").read_text())
    assert [(x["op"], x["bytes"]) for x in data["results"]] == [
        ("all_reduce", 4096), ("all_reduce", 16384), ("all_gather", 4096), ("all_gather", 16384)]
    assert all(x["ratio"] > 0 for x in data["results"]) and "neuron/gloo" in r.stdout
    r = subprocess.run([sys.executable, os.path.join(bench, "ddp_overlap.py"), "--depth", "2", "--width", "64",
                        "--steps", "1", "--rounds", "1", "--bucket-mb", "0.01"],
                       capture_output=True, text=True, timeout=DEADLINE_S, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "hidden behind device work" in r.stdout and "all-reduces in 1 traced steps" in r.stdout, r.stdout


@pytest.mark.parametrize("nproc", [2, 4])
def test_llama_tensor_parallel_and_2d_fsdp(nproc):
    """bench/python/tp_fsdp.py: a tiny Llama with tensor parallelism on its attention and MLP
    (column/row-wise) over a "tp" mesh dimension of 2 and FSDP2 over "dp" (1 with 2
    processes, 2 with 4: a 2-D mesh), 4 AdamW steps checked, then timed blocks: losses of
    every step and the final gathered weights bit-equal to the same run on CPU with Gloo
    (the script exits 1 otherwise)."""
    pytest.importorskip("transformers", reason="the model is transformers' LlamaForCausalLM")
    bench = os.path.join(os.path.dirname(os.path.dirname(HERE)), "bench", "python")
    r = subprocess.run([sys.executable, os.path.join(bench, "tp_fsdp.py"), "--nproc", str(nproc), "--tp", "2", "--tiny",
                        "--steps", "4", "--rounds", "1", "--block", "1", "--seq", "16", "--timeout", str(DEADLINE_S)],
                       capture_output=True, text=True, timeout=DEADLINE_S + 30, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    result = json.loads([l for l in r.stdout.splitlines() if l.startswith("RESULT ")][-1][7:])
    assert (result["world"], result["dp"], result["tp"]) == (nproc, nproc // 2, 2)
    assert len(result["losses"]) == 4 and len(set(result["losses"])) > 1  # it trains
    assert result["cpu_step_s"] > 0 and result["neuron_step_s"] > 0
