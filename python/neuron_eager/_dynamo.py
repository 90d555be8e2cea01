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
static-cache decoding) then work unchanged.

torch.compile's `mode`: "default" and "reduce-overhead" (there are no CUDA graphs to
capture) compile as above; "max-autotune" and "max-autotune-no-cudagraphs" run the
graph's programs fused without a trial against per-op runs and ask for tier-2 kernels for
every group at its first fused run (tier 2's cost gate skipped). The graph's first call
plans its programs (its ops run per op, as at any first sighting), its second runs them
fused and returns only when the kernels are built (or loaded from the disk cache); the
next calls verify them against tier 1 (native_trials runs) and keep them where faster. `options` takes {"max_autotune": bool}; anything
else is one error naming what is allowed."""

import itertools
import warnings

from . import _C

_warned = set()
_graph_ids = itertools.count(1)


_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
_OPTIONS = ("max_autotune",)


def _autotunes(mode, options):
    """Whether torch.compile's mode/options ask for max-autotune; ValueError naming what
    is allowed for anything else."""
    if mode is not None and mode not in _MODES:
        raise ValueError(f"neuron backend: mode {mode!r} is not supported; expected one of "
                         f"{', '.join(repr(m) for m in _MODES)}")
    autotune = mode is not None and mode.startswith("max-autotune")
    if options is not None:
        if not isinstance(options, dict):
            raise ValueError(f"neuron backend: options must be a dict, not {type(options).__name__}")
        unknown = sorted(str(k) for k in options if k not in _OPTIONS)
        if unknown:
            raise ValueError(f"neuron backend: unknown option(s) {', '.join(unknown)}; "
                             f"allowed: {', '.join(_OPTIONS)}")
        value = options.get("max_autotune", autotune)
        if not isinstance(value, bool):
            raise ValueError(f"neuron backend: option max_autotune must be True or False, not {value!r}")
        autotune = value
    return autotune


def _region(forward, autotune=False):
    """forward run as one compiled region (positional arguments). Each graph has its id:
    the policy's region_max_programs bounds the keys one graph compiles at first sight.
    autotune: the first two runs (per op, then fused) wait for the device and then for
    the tier-2 builds the graph's groups asked for."""
    enter, exit_ = _C.enter_compiled_region, _C.exit_compiled_region
    graph = next(_graph_ids)
    pending = [2 if autotune else 0]

    def run(*args):
        enter(graph, autotune)
        try:
            return forward(*args)
        finally:
            exit_()
            if pending[0]:
                pending[0] -= 1
                _C.synchronize(-1)  # the groups ran: their builds are queued
                _C.native_wait_idle()

    return run


def _boxed_region(gm, example_inputs, autotune=False):  # noqa: ARG001 - AOTAutograd's signature
    """AOTAutograd's graph compiler: boxed calling convention (the argument list is
    cleared, so inputs the graph no longer needs can be freed while it runs)."""
    run = _region(gm.forward, autotune)

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


def neuron_backend(gm, example_inputs, mode=None, options=None):
    autotune = _autotunes(mode, options)
    if not _needs_autograd(example_inputs):
        # Inference: the graph as captured. Its composite ops decompose at run time as in
        # eager, on the real tensors' layouts (AOTAutograd would fix them at trace time
        # from fake tensors, whose strides can differ from what CPU kernels give).
        return _region(gm.forward, autotune)
    try:
        import functools

        from torch._dynamo.backends.common import aot_autograd

        compiler = functools.partial(_boxed_region, autotune=autotune)
        return aot_autograd(fw_compiler=compiler, bw_compiler=compiler)(gm, example_inputs)
    except Exception as e:  # noqa: BLE001 - any failure of ours must not fail the user's run
        cause = f"{type(e).__name__}: {e}".splitlines()[0][:300]
        if cause not in _warned:
            _warned.add(cause)
            warnings.warn(f"neuron backend: AOTAutograd could not take this graph ({cause}); "
                          "it runs as captured, op by op inside a compiled region", stacklevel=2)
        return _region(gm.forward, autotune)
