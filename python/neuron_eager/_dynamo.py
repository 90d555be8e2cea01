"""`torch.compile(..., backend="neuron")`: each run of a graph Dynamo captured is a compiled
region of the engine. Its segments start and end at the graph's edges, so their keys are
the same at every run, and they get a fused program at their first sighting in any mode
(eager included): the graph is known to recur, nothing waits for the policy's
hot_threshold. Tier-2 kernels follow from the background as in adaptive mode, and the
guard still keeps a program only where it beats per-op runs.

Graphs that need autograd go through AOTAutograd, so training compiles too: the forward
and the backward graph (run by autograd on its own thread) are each a region. Inference
graphs run as Dynamo captured them. No decompositions are asked
for: the ATen ops the graphs hold are the ones eager runs, so results stay bit-equal to
CPU eager. If AOTAutograd cannot take a graph, the graph runs as Dynamo captured it (still
a region), with one warning naming the cause.

Registered through the `torch_dynamo_backends` entry point, so nothing is imported until a
user asks for it; libraries that compile for a device named "neuron" (transformers'
static-cache decoding) then work unchanged."""

import itertools
import warnings

from . import _C

_warned = set()
_graph_ids = itertools.count(1)


def _region(forward):
    """forward run as one compiled region (positional arguments). Each graph has its id:
    the policy's region_max_programs bounds the keys one graph compiles at first sight."""
    enter, exit_ = _C.enter_compiled_region, _C.exit_compiled_region
    graph = next(_graph_ids)

    def run(*args):
        enter(graph)
        try:
            return forward(*args)
        finally:
            exit_()

    return run


def _boxed_region(gm, example_inputs):  # noqa: ARG001 - AOTAutograd's compiler signature
    """AOTAutograd's graph compiler: boxed calling convention (the argument list is
    cleared, so inputs the graph no longer needs can be freed while it runs)."""
    run = _region(gm.forward)

    def boxed(args):
        flat = list(args)
        args.clear()
        return run(*flat)

    boxed._boxed_call = True
    return boxed


def _needs_autograd(example_inputs):
    import torch

    return torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs)


def neuron_backend(gm, example_inputs):
    if not _needs_autograd(example_inputs):
        # Inference: the graph as captured. Its composite ops decompose at run time as in
        # eager, on the real tensors' layouts (AOTAutograd would fix them at trace time
        # from fake tensors, whose strides can differ from what CPU kernels give).
        return _region(gm.forward)
    try:
        from torch._dynamo.backends.common import aot_autograd

        return aot_autograd(fw_compiler=_boxed_region, bw_compiler=_boxed_region)(gm, example_inputs)
    except Exception as e:  # noqa: BLE001 - any failure of ours must not fail the user's run
        cause = f"{type(e).__name__}: {e}".splitlines()[0][:300]
        if cause not in _warned:
            _warned.add(cause)
            warnings.warn(f"neuron backend: AOTAutograd could not take this graph ({cause}); "
                          "it runs as captured, op by op inside a compiled region", stacklevel=2)
        return _region(gm.forward)
