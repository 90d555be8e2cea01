"""`torch.compile(..., backend="neuron")`: each run of a graph Dynamo captured is a compiled
region of the engine. Its segments start and end at the graph's edges, so their keys are
the same at every run, and they get a fused program at their first sighting in any mode
(eager included): the graph is known to recur, nothing waits for the policy's
hot_threshold. Tier-2 kernels follow from the background as in adaptive mode, and the
guard still keeps a program only where it beats per-op runs.

Registered through the `torch_dynamo_backends` entry point, so nothing is imported until a
user asks for it; libraries that compile for a device named "neuron" (transformers'
static-cache decoding) then work unchanged."""

from . import _C


def neuron_backend(gm, example_inputs):  # noqa: ARG001 - Dynamo's backend signature
    forward = gm.forward
    enter, exit_ = _C.enter_compiled_region, _C.exit_compiled_region

    def run(*args):
        enter()
        try:
            return forward(*args)
        finally:
            exit_()

    return run
