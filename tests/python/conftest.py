import os
import sys
import tempfile

# Tier-2 kernels built by tests go to a per-session folder, never the user's cache (set
# before torch loads the engine, which reads it once).
os.environ.setdefault("NEURON_CACHE_DIR", tempfile.mkdtemp(prefix="neuron-test-cache-"))

import pytest  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(autouse=True)
def _drain_device():
    """Each test starts and ends with empty queues: memory counters and errors of one test
    never leak into the next."""
    torch.neuron.synchronize()
    yield
    torch.neuron.synchronize()


def pytest_terminal_summary(terminalreporter):
    stats = getattr(terminalreporter.config, "_opinfo_stats", None)
    if stats:
        terminalreporter.write_line(
            f"OpInfo coverage: {stats['passed']} of {stats['total']} float32 OpInfos match CPU "
            f"(values and strides) on neuron ({stats['excluded']} excluded with reasons, {stats['failed']} failed); "
            f"{stats['samples']} samples compared")
