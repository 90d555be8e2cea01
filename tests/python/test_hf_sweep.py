"""The fast subset of the architecture sweep (issue 24 item 3; the whole list is
`python bench/python/hf_sweep.py`): causal LMs picked from transformers' own mapping, built
from tiny random configs, logits of a padded batch bit-equal to CPU and greedy tokens equal
with the dynamic and the static cache, in eager mode and in adaptive mode (child process)."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("transformers", reason="transformers is not installed")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench", "python"))

import hf_archs  # noqa: E402

# Dense, sliding-window + soft-capping, partial rotary, a state-space model, and two
# mixture-of-experts families (grouped-mm experts: integer histc; latent attention).
SUBSET = ["llama", "gemma2", "phi", "mamba", "qwen3_moe", "deepseek_v3"]
CLASSES = dict(hf_archs.architectures())


def test_subset_comes_from_the_library():
    assert len(CLASSES) > 100
    assert all(name in CLASSES for name in SUBSET)


@pytest.mark.parametrize("name", SUBSET)
def test_architecture_matches_cpu(name):
    status, detail = hf_archs.check(name, CLASSES[name])
    assert status == "pass", f"{name}: {status}: {detail}"


def test_subset_adaptive_matches_cpu():
    code = ("import sys, hf_archs; c = dict(hf_archs.architectures()); "
            f"r = {{n: hf_archs.check(n, c[n]) for n in {SUBSET!r}}}; "
            "bad = {n: v for n, v in r.items() if v[0] != 'pass'}; "
            "print(bad); sys.exit(1 if bad else 0)")
    env = dict(os.environ, NEURON_EAGER_MODE="adaptive")
    r = subprocess.run([sys.executable, "-c", code], cwd=os.path.join(ROOT, "bench", "python"),
                       env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
