"""Tier 2 (generated C++ kernels) and its persistent cache: results equal per-op eager,
kernels are checked against tier 1 before use, a second process starts warm from the
cache, and broken compilers, corrupt or half-written cache entries, two processes
compiling one key at once and failures inside fused segments leave results intact.

Every run happens in a subprocess with its own NEURON_CACHE_DIR (tests/python/
native_workload.py), so counters start at zero and the user's cache is never touched.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

WORKLOAD = Path(__file__).with_name("native_workload.py")


def run_workload(cache, *args, env=None, check=True):
    e = dict(os.environ)
    e["NEURON_CACHE_DIR"] = str(cache)
    e.update(env or {})
    p = subprocess.run([sys.executable, str(WORKLOAD), *args], env=e, capture_output=True,
                       text=True, timeout=600)
    if check:
        assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1]), p


def entries(cache):
    return sorted((Path(cache) / "native-v1").glob("*.so"))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_tier2_kernels_match_eager_and_are_verified(tmp_path, dtype):
    r, _ = run_workload(tmp_path, "--dtype", dtype)
    c = r["counters"]
    assert r["equal"], c                       # every step bit-equal to CPU eager
    assert c["native_built"] >= 1, c           # the chain's groups got kernels
    assert c["native_rejected_mismatch"] == 0, c  # and each matched tier 1 bit for bit
    # Kept only if faster than tier 1: a decision was taken for every built kernel.
    assert c["native_accepted"] + c["native_rejected_slower"] == c["native_built"], c
    if c["native_accepted"]:
        assert c["native_runs"] > 0, c
    assert len(entries(tmp_path)) == c["native_compiles"]


def test_second_process_starts_warm(tmp_path):
    first, _ = run_workload(tmp_path)
    assert first["equal"] and first["counters"]["native_compiles"] >= 1
    second, _ = run_workload(tmp_path)
    c = second["counters"]
    assert second["equal"], c
    assert c["native_compiles"] == 0, c        # nothing rebuilt
    assert c["native_disk_hits"] >= 1, c
    if first["counters"]["native_accepted"]:
        # Verified kernels are swapped in before the first fused run: the segment is hot
        # after 2 occurrences (hot_threshold=2), so step 2 is its first fused run.
        assert second["first_tier2_step"] == 2, second


@pytest.mark.parametrize("compiler", ["false", "/nonexistent/c++"])
def test_failing_compiler_keeps_tier1_and_results(tmp_path, compiler):
    r, p = run_workload(tmp_path, "--steps", "15", env={"NEURON_CXX": compiler})
    c = r["counters"]
    assert r["equal"], c
    assert c["native_build_failures"] >= 1 and c["native_runs"] == 0, c
    assert c["segments_fused"] > 0, c          # tier 1 kept fusing
    assert "tier-2 build failed" in p.stderr   # one warning naming what failed
    assert entries(tmp_path) == []


@pytest.mark.parametrize("damage", ["corrupt", "half-written"])
def test_damaged_cache_entry_is_rebuilt(tmp_path, damage):
    first, _ = run_workload(tmp_path, "--steps", "15")
    built = entries(tmp_path)
    assert built
    for so in built:
        if damage == "corrupt":
            data = bytearray(so.read_bytes())
            data[len(data) // 2: len(data) // 2 + 64] = b"\xff" * 64
            so.write_bytes(bytes(data))         # checksum file kept: mismatch
        else:
            so.write_bytes(so.read_bytes()[: 1000])
            Path(str(so) + ".sum").unlink()     # the writer died before the checksum
    r, _ = run_workload(tmp_path, "--steps", "15")
    c = r["counters"]
    assert r["equal"], c
    assert c["native_corrupt_entries"] == len(built), c
    assert c["native_compiles"] == len(built), c
    assert all(Path(str(so) + ".sum").exists() for so in entries(tmp_path))


def test_two_processes_compile_one_key_once(tmp_path):
    start = time.time() + 3.0                  # both past start-up, then hot together
    e = dict(os.environ, NEURON_CACHE_DIR=str(tmp_path))
    procs = [subprocess.Popen([sys.executable, str(WORKLOAD), "--steps", "20",
                               "--start-at", str(start)], env=e, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert all(r["equal"] for r in results)
    kernels = len(entries(tmp_path))
    assert kernels >= 1
    # The per-key lock: each kernel compiled by exactly one process; the other waited and
    # loaded it from the cache.
    assert sum(r["counters"]["native_compiles"] for r in results) == kernels, results
    assert sum(r["counters"]["native_disk_hits"] for r in results) >= kernels, results


def test_failure_inside_tier2_segment_reruns_per_op(tmp_path):
    run_workload(tmp_path, "--steps", "15")     # warm the cache: tier 2 from the first run
    r, _ = run_workload(tmp_path, "--steps", "12", "--inject-at", "6")
    c = r["counters"]
    assert r["equal"], c
    assert c["fusion_failures"] >= 1, c


def test_random_programs_on_tier2_match_cpu_bit_for_bit(tmp_path):
    """Differential test of tier 2: random pointwise programs (fp32/fp64, odd sizes for
    scalar tails) with every group compiled; each kernel is also checked against tier 1
    before use, and none may be rejected for differing."""
    e = dict(os.environ, NEURON_CACHE_DIR=str(tmp_path))
    p = subprocess.run([sys.executable, str(Path(__file__).with_name("native_diff.py")),
                        "--programs", "16"], env=e, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    c = r["counters"]
    assert r["mismatches"] == [], r
    assert c["native_rejected_mismatch"] == 0, c
    assert c["native_built"] >= 8 and c["native_runs"] > 0, c


def test_foreach_groups_on_tier2_match_cpu_bit_for_bit(tmp_path):
    """Foreach groups (optimizer updates, in place, functional temporaries, MKL's sqrt)
    get one kernel per list element: every case equals CPU after every run (the first
    runs on tier 1, then the kernel, checked against tier 1 on copies of the state),
    none is rejected for differing, and each case runs its kernel in some dtype; lists
    with non-contiguous operands keep tier 1."""
    e = dict(os.environ, NEURON_CACHE_DIR=str(tmp_path))
    p = subprocess.run([sys.executable, str(Path(__file__).with_name("foreach_native_diff.py"))],
                       env=e, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    for case, per_dtype in r.items():
        for dtype, c in per_dtype.items():
            assert c["equal"], (case, dtype, c)
            assert c["rejected_mismatch"] == 0, (case, dtype, c)
        if case == "noncontiguous":
            assert all(c["unsupported"] >= 1 and c["runs"] == 0 for c in per_dtype.values()), r[case]
        else:
            # Each case's kernel is built and tried against tier 1 (the trials compare bits:
            # rejected_mismatch is 0 above). Whether it then stays is a timing verdict on a
            # shared 2-core machine (float64 sqrt_neg_abs loses to tier 1; under load float32
            # may too), so a kernel rejected as slower counts here; some case must run kernels.
            assert any((c["accepted"] >= 1 and c["runs"] > 0) or c["rejected_slower"] >= 1
                       for c in per_dtype.values()), (case, per_dtype)
    assert sum(c["runs"] for d in r.values() for c in d.values()) > 0, r
    # AdamW's column-major gradient element ran on tier 1 beside the kernel, each run.
    adamw = r["torch_adamw"]["float32"]
    assert adamw["foreach_tier1_elements"] >= adamw["runs"] > 0, adamw
    assert all(c["foreach_tier1_elements"] == 0 for case, d in r.items() if case != "torch_adamw"
               for c in d.values()), r


def test_row_programs_on_tier2_match_cpu_bit_for_bit(tmp_path):
    """Differential test of row kernels: random programs of layer norm (with and without
    weight and bias), softmax and log_softmax over the last dim, with pointwise ops around
    them and operands broadcast down or along the rows, fp32 and fp64; every group's
    kernel is built, checked against tier 1, and must equal CPU eager bit for bit."""
    e = dict(os.environ, NEURON_CACHE_DIR=str(tmp_path))
    p = subprocess.run([sys.executable, str(Path(__file__).with_name("row_diff.py")),
                        "--programs", "12", "--seed", "3"], env=e, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    c = r["counters"]
    assert r["mismatches"] == [], r
    assert c["native_rejected_mismatch"] == 0 and c["native_build_failures"] == 0, c
    assert c["native_built"] >= 8 and c["native_runs"] > 0, c
    # Row ops were compiled, not left to tier 1.
    sources = "\n".join(f.read_text() for f in tmp_path.rglob("*.cpp"))
    assert "row_moments(in" in sources and "reduce_all" in sources


def test_kernels_compile_with_the_precompiled_prelude(tmp_path):
    """After the first kernel this machine compiles, the background pool builds the
    prelude's precompiled header once (in NEURON_PRELUDE_DIR); later compiles pass it with
    -include, and their kernels still equal CPU eager bit for bit. A broken prelude folder
    only costs speed."""
    log = tmp_path / "cxx.log"
    wrapper = tmp_path / "cxx.sh"
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec c++ "$@"\n')
    wrapper.chmod(0o755)
    env = dict(os.environ, NEURON_CACHE_DIR=str(tmp_path / "cache"), NEURON_CXX=str(wrapper),
               NEURON_PRELUDE_DIR=str(tmp_path / "pch"))
    script = Path(__file__).with_name("row_diff.py")
    p = subprocess.run([sys.executable, str(script), "--programs", "4", "--seed", "11"], env=env,
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["mismatches"] == [] and r["counters"]["native_rejected_mismatch"] == 0, r
    lines = log.read_text().splitlines()
    headers = [i for i, l in enumerate(lines) if "c++-header" in l]
    assert len(headers) == 1, lines  # built once
    assert list((tmp_path / "pch").rglob("neuron_prelude.h.gch"))
    later = [l for l in lines[headers[0] + 1:] if "-shared" in l]
    assert later and all("-include" in l for l in later), lines
    # Kernels link against the empty stand-in for libtorch_cpu.so built once beside the
    # prelude (the linker never reads the real 430 MB library); they load and run with
    # the loaded one, as the bit-equal results above show.
    kernels = [l for l in lines if "-shared" in l and ".cpp" in l]
    stubs = list((tmp_path / "pch").rglob("link-*/libtorch_cpu.so"))
    assert len(stubs) == 1 and stubs[0].stat().st_size < 64 * 1024, stubs
    assert kernels and all(f"-L{stubs[0].parent} " in l and "-l:libtorch_cpu.so" in l
                           and "-ltorch_cpu" not in l for l in kernels), kernels
    assert len([l for l in lines if "-soname,libtorch_cpu.so" in l]) == 1, lines
    # A prelude folder that cannot be created: kernels compile without the prelude and
    # link against the real library.
    (tmp_path / "file").write_text("")
    log.write_text("")
    env.update(NEURON_CACHE_DIR=str(tmp_path / "cache2"), NEURON_PRELUDE_DIR=str(tmp_path / "file" / "pch"))
    p = subprocess.run([sys.executable, str(script), "--programs", "3", "--seed", "12"], env=env,
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["mismatches"] == [] and r["counters"]["native_build_failures"] == 0, r
    kernels = [l for l in log.read_text().splitlines() if "-shared" in l and ".cpp" in l]
    assert kernels and all("-ltorch_cpu" in l for l in kernels), kernels


def test_hung_compiler_is_killed_and_tier1_keeps_running(tmp_path):
    """A compiler that never finishes (it answers --version, then hangs on every build) is
    killed after NEURON_COMPILE_TIMEOUT_S with its process group; the groups keep running
    on tier 1 with CPU's results, one warning names the timeout, nothing is left behind."""
    hang = tmp_path / "hang-c++"
    hang.write_text("#!/bin/sh\n"
                    "if [ \"$1\" = --version ]; then echo 'hanging c++ 1.0'; exit 0; fi\n"
                    "sleep 613 &\nwait\n")
    hang.chmod(0o755)
    r, p = run_workload(tmp_path, "--steps", "15",
                        env={"NEURON_CXX": str(hang), "NEURON_COMPILE_TIMEOUT_S": "0.5",
                             "NEURON_PRELUDE_DIR": "off"})
    c = r["counters"]
    assert r["equal"], c
    assert c["native_build_failures"] >= 1 and c["native_runs"] == 0, c
    assert c["segments_fused"] > 0, c
    assert "NEURON_COMPILE_TIMEOUT_S" in p.stderr and "killed" in p.stderr, p.stderr[-2000:]
    assert entries(tmp_path) == []
    # The killed group's sleeps are gone too (the whole process group was killed).
    for pattern in (str(hang), "sleep 613"):
        left = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
        assert left.stdout.strip() == "", (pattern, left.stdout)


def test_exit_during_a_build_kills_the_compiler_and_removes_its_files(tmp_path):
    """A process that exits while its compiler runs (builds never hold up an exit) kills
    the compiler's process group and removes the files it was writing: nothing is left in
    the cache folder for a later open to collect."""
    slow = tmp_path / "slow-c++"
    slow.write_text("#!/bin/sh\n"
                    "if [ \"$1\" = --version ]; then echo 'slow c++ 1.0'; exit 0; fi\n"
                    "while [ $# -gt 0 ]; do [ \"$1\" = -o ] && out=\"$2\"; shift; done\n"
                    f"echo partial > \"$out\"; touch {tmp_path}/started\n"
                    "sleep 617 &\nwait\n")
    slow.chmod(0o755)
    # Four steps: the key is hot after two, its build starts, and the workload exits
    # (without waiting for builds) while the compiler sleeps.
    r, p = run_workload(tmp_path, "--steps", "4",
                        env={"NEURON_CXX": str(slow), "NEURON_PRELUDE_DIR": "off"})
    assert r["equal"], r
    assert (tmp_path / "started").exists(), r
    left = [n.name for n in (tmp_path / "native-v1").iterdir() if ".tmp." in n.name]
    assert left == []
    for pattern in (str(slow), "sleep 617"):
        alive = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
        assert alive.stdout.strip() == "", (pattern, alive.stdout)


def test_the_compiler_runs_in_the_idle_scheduling_class(tmp_path):
    """Builds are background work: the driver and what it starts run under SCHED_IDLE
    (policy 5), so on a small machine they take only cores no thread of ours wants."""
    log = tmp_path / "policy.log"
    wrapper = tmp_path / "cxx.sh"
    wrapper.write_text(f"#!/bin/sh\ngrep -m1 '^policy' /proc/$$/sched >> {log}\nexec c++ \"$@\"\n")
    wrapper.chmod(0o755)
    r, p = run_workload(tmp_path, "--steps", "10", env={"NEURON_CXX": str(wrapper)})
    assert r["equal"] and r["counters"]["native_compiles"] >= 1, r
    policies = {line.split(":")[1].strip() for line in log.read_text().splitlines()}
    assert policies == {"5"}, log.read_text()


def test_bad_compile_timeout_is_one_clear_error():
    r = subprocess.run([sys.executable, "-c", "import torch; torch.neuron.device_count()"],
                       env={**os.environ, "NEURON_COMPILE_TIMEOUT_S": "soon"},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "NEURON_COMPILE_TIMEOUT_S" in r.stderr and "0.1 to 86400" in r.stderr, r.stderr[-1500:]


def test_a_full_cache_disk_costs_speed_only_with_one_warning(tmp_path):
    """A compiler that cannot write into the kernel cache (ENOSPC there, as on a full
    disk) leaves results intact: the process warns once, then builds its kernels in a
    private temporary folder and still runs them."""
    cache = tmp_path / "cache"
    wrapper = tmp_path / "cxx.sh"
    wrapper.write_text('#!/bin/sh\ncase "$*" in\n'
                       f'  *{cache}*) echo "{cache}/x.so: No space left on device" >&2; exit 1;;\n'
                       'esac\nexec c++ "$@"\n')
    wrapper.chmod(0o755)
    env = dict(os.environ, NEURON_CACHE_DIR=str(cache), NEURON_CXX=str(wrapper),
               NEURON_PRELUDE_DIR=str(tmp_path / "pch"))
    p = subprocess.run([sys.executable, str(Path(__file__).with_name("native_diff.py")),
                        "--programs", "6", "--seed", "4"], env=env, capture_output=True, text=True,
                       timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    c = r["counters"]
    assert r["mismatches"] == [], r
    assert c["native_private_builds"] >= 1 and c["native_runs"] >= 1, c
    assert p.stderr.count("cannot be written") == 1, p.stderr[-3000:]
    assert "No space left on device" in p.stderr
    assert not list(cache.rglob("*.so"))  # nothing was written there
