"""The tier-2 kernel cache shared by processes: four processes compiling different kernels
into one cache with a small bound (NEURON_CACHE_MAX_BYTES) leave it under the bound, with
results equal to CPU; the temporaries of a process killed mid-compile are gone once the
next process opens the cache; `python -m neuron_eager.cache list|verify|clear`.

Workloads are tests/python/native_diff.py runs (random pointwise programs, every group
compiled) in subprocesses with their own NEURON_CACHE_DIR.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

DIFF = Path(__file__).with_name("native_diff.py")
BOUND = 128 << 10


def folder_bytes(folder: Path) -> tuple[int, list[str]]:
    """Bytes of the files in the folder (as they are now), and the temporaries' names."""
    total, temporaries = 0, []
    for e in os.scandir(folder) if folder.exists() else []:
        try:
            total += e.stat(follow_symlinks=False).st_size
        except FileNotFoundError:
            continue
        if ".tmp." in e.name:
            temporaries.append(e.name)
    return total, temporaries


def start_diff(cache, seed, programs, **kw):
    env = dict(os.environ, NEURON_CACHE_DIR=str(cache), NEURON_CACHE_MAX_BYTES=str(BOUND))
    return subprocess.Popen([sys.executable, str(DIFF), "--programs", str(programs), "--seed", str(seed)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def result(p):
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def cache_command(root, *args, env=None):
    return subprocess.run([sys.executable, "-m", "neuron_eager.cache", *args, "--dir", str(root)],
                          env=dict(os.environ, **(env or {})), capture_output=True, text=True,
                          timeout=120)


def test_four_processes_keep_the_cache_under_its_bound(tmp_path):
    folder = tmp_path / "native-v1"
    procs = [start_diff(tmp_path, seed, 6) for seed in (1, 2, 3, 4)]
    # The folder's size while they compile: over the bound only by builds in flight (a
    # source, an object being written, or one committed before its process evicts).
    most = 0
    while any(p.poll() is None for p in procs):
        most = max(most, folder_bytes(folder)[0])
        time.sleep(0.02)
    results = [result(p) for p in procs]
    for r in results:
        assert r["mismatches"] == [], r
        assert r["counters"]["native_rejected_mismatch"] == 0, r
    compiles = sum(r["counters"]["native_compiles"] for r in results)
    evictions = sum(r["counters"]["native_cache_evictions"] for r in results)
    final, temporaries = folder_bytes(folder)
    print(f"{compiles} compiles, {evictions} evictions; bound {BOUND} B, "
          f"final {final} B, at most {most} B seen during the run")
    assert compiles >= 20 and evictions >= compiles // 2, results
    assert final <= BOUND, final
    assert temporaries == []
    assert most <= BOUND + 4 * 64 * 1024, most  # four builds in flight at most
    # What is left is intact.
    p = cache_command(tmp_path, "verify")
    assert p.returncode == 0 and " 0 corrupt" in p.stdout, p.stdout + p.stderr


@pytest.fixture(scope="module")
def killed_then_reopened(tmp_path_factory):
    """A cache whose first writer was killed (SIGKILL, with its compiler) mid-compile, then
    used by a second process: (the cache root, the killed pid, its temporaries seen)."""
    root = tmp_path_factory.mktemp("killed")
    folder = root / "native-v1"
    victim = start_diff(root, 5, 6, start_new_session=True)
    deadline, mine = time.time() + 120, []
    while not mine and time.time() < deadline and victim.poll() is None:
        mine = [n for n in folder_bytes(folder)[1] if f".tmp.{victim.pid}." in n]
        time.sleep(0.005)
    os.killpg(victim.pid, signal.SIGKILL)
    victim.communicate()
    assert mine, "the first process never compiled"
    r = result(start_diff(root, 6, 2))
    assert r["mismatches"] == [] and r["counters"]["native_compiles"] >= 1, r
    return root, victim.pid, mine


def test_temporaries_of_a_killed_process_go_on_the_next_open(killed_then_reopened):
    root, pid, seen = killed_then_reopened
    left = folder_bytes(root / "native-v1")[1]
    assert not [n for n in left if f".tmp.{pid}." in n], (seen, left)
    assert left == []


def test_cache_command_lists_verifies_and_clears(killed_then_reopened):
    root = killed_then_reopened[0]
    folder = root / "native-v1"
    p = cache_command(root, "list", "--json")
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    kernels = [e for e in s["entries"] if e["kernel"]]
    assert kernels and s["total_bytes"] == folder_bytes(folder)[0], s
    assert all(e["bytes"] > 0 and e["last_use"] > 0 for e in s["entries"]), s
    p = cache_command(root, "list", env={"NEURON_CACHE_MAX_BYTES": "1G"})
    assert p.returncode == 0, p.stderr
    assert f"{len(s['entries'])} entries" in p.stdout and "of 1024.00 MiB" in p.stdout, p.stdout
    assert all(e["key"] in p.stdout for e in s["entries"]), p.stdout
    assert ("verified" in p.stdout) == any(e["verified"] for e in s["entries"])
    # A damaged kernel is reported (exit status 1), the others are intact.
    so = folder / (kernels[0]["key"] + ".so")
    data = bytearray(so.read_bytes())
    data[100:164] = b"\xff" * 64
    so.write_bytes(bytes(data))
    p = cache_command(root, "verify")
    assert p.returncode == 1, p.stdout + p.stderr
    assert f"corrupt: {kernels[0]['key']}" in p.stdout
    assert f"{len(kernels) - 1} kernels intact, 1 corrupt" in p.stdout, p.stdout
    # The guard's kept verdicts go with the kernels.
    planted = root / "verdicts-v1" / "00000000000000ab" / "0000000000000001"
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.write_text("kept 0.5\n")
    verdicts = len(list((root / "verdicts-v1").glob("*/*")))
    p = cache_command(root, "clear")
    assert p.returncode == 0 and f"removed {len(s['entries'])} entries" in p.stdout, p.stdout
    assert f"and {verdicts} guard verdicts" in p.stdout, p.stdout
    assert folder_bytes(folder) == (0, []) and list(folder.iterdir()) == []
    assert not (root / "verdicts-v1").exists()
    # A bad bound names the variable and what is allowed.
    p = cache_command(root, "list", env={"NEURON_CACHE_MAX_BYTES": "lots"})
    assert p.returncode != 0
    assert "NEURON_CACHE_MAX_BYTES='lots' is not valid: expected a byte count from 64K" in p.stderr
