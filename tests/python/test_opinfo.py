"""Op coverage from PyTorch's own OpInfo database: every OpInfo whose float32 samples run
on CPU runs on `neuron` and must match CPU eager bit for bit (see opinfo_util for the
few exclusions and tolerant comparisons, each with its reason)."""

import pytest
import torch

from opinfo_util import EXCLUDED, float32_ops, op_id, run_op

OPS = float32_ops()
_stats = {"total": len(OPS), "passed": 0, "failed": 0, "excluded": 0, "samples": 0}


@pytest.fixture(scope="module", autouse=True)
def _report(request):
    request.config._opinfo_stats = _stats
    yield


@pytest.mark.parametrize("op", OPS, ids=op_id)
def test_op_matches_cpu(op):
    name = op_id(op)
    if name in EXCLUDED:
        _stats["excluded"] += 1
        pytest.skip(EXCLUDED[name])
    try:
        _stats["samples"] += run_op(op)
    except BaseException:
        _stats["failed"] += 1
        raise
    _stats["passed"] += 1


def test_opinfo_database_is_large():
    # Guards against a silently empty parametrisation (an import problem, say).
    assert len(OPS) > 500
