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


def _example(node):
    """The tensor Dynamo recorded for an FX node (its fake example value), or None."""
    import torch

    v = node.meta.get("example_value") if hasattr(node, "meta") else None
    return v if isinstance(v, torch.Tensor) else None


def _lerp_as_add(gm):
    """Dynamo traces an in-place foreach lerp with a number weight (Adam's and AdamW's
    first moment) as `diff = _foreach_sub(end, self)`, a `full_like(diff[i], w)` per
    element and `_foreach_addcmul_(self, fulls, diff)`: n tensors filled only to be
    multiplied by. `_foreach_add_(self, diff, alpha=w)` computes the same fused
    multiply-add (ATen's CPU kernels give equal bits for both, which the compile tests
    check against the CPU capture) without the fills, and keeps the step one run of
    foreach ops for tier 2. Returns how many such ops it rewrote."""
    import torch

    rewritten = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not torch._foreach_addcmul_ or node.kwargs:
            continue
        if len(node.args) != 3 or len(node.users) != 0:
            continue
        self_list, fulls, diffs = node.args
        if not isinstance(fulls, (list, tuple)) or not isinstance(diffs, (list, tuple)):
            continue
        if len(fulls) != len(diffs) or not fulls:
            continue
        weight = None
        ok = True
        for full, diff in zip(fulls, diffs):
            # float32/float64 only: a reduced-precision fill rounds w to its dtype, where
            # add's alpha stays in float32.
            dv = _example(diff)
            if not (hasattr(full, "op") and full.op == "call_function" and full.target is torch.full_like
                    and not full.kwargs and len(full.args) == 2 and full.args[0] is diff
                    and len(full.users) == 1 and isinstance(full.args[1], (int, float))
                    and not isinstance(full.args[1], bool) and dv is not None
                    and dv.dtype in (torch.float32, torch.float64)):
                ok = False
                break
            if weight is not None and full.args[1] != weight:
                ok = False
                break
            weight = full.args[1]
        if not ok:
            continue
        with gm.graph.inserting_before(node):
            gm.graph.call_function(torch._foreach_add_, (self_list, diffs), {"alpha": weight})
        gm.graph.erase_node(node)
        for full in fulls:
            gm.graph.erase_node(full)
        rewritten += 1
    return rewritten


def _cpu_scalars_as_numbers(gm):
    """Adam's and AdamW's bias corrections, traced, are lists of 0-dim CPU tensors that
    divide lists on the device (`_foreach_div_(denoms, corrections)`): a tensor operand
    per element ends the step's run of foreach ops that tier 2 fuses. Their values are
    on the host when the op runs, so the op takes them as numbers instead (the ScalarList
    overload: the same float32 value divides, multiplies, adds or subtracts). Only lists
    of 0-dim CPU tensors of the device tensors' own floating dtype are rewritten, and the
    numbers are read right before the op (after any in-place update of theirs)."""
    import torch

    targets = (torch._foreach_div_, torch._foreach_mul_, torch._foreach_add_, torch._foreach_sub_)
    rewritten = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in targets or node.kwargs or len(node.args) != 2:
            continue
        tensors, others = node.args
        if not isinstance(tensors, (list, tuple)) or not isinstance(others, (list, tuple)):
            continue
        if len(tensors) != len(others) or not tensors:
            continue
        ok = True
        for t, o in zip(tensors, others):
            tv, ov = _example(t), _example(o)
            if (tv is None or ov is None or tv.device.type == "cpu" or ov.device.type != "cpu"
                    or ov.dim() != 0 or ov.dtype != tv.dtype or not tv.dtype.is_floating_point):
                ok = False
                break
        if not ok:
            continue
        with gm.graph.inserting_before(node):
            numbers = [gm.graph.call_method("item", (o,)) for o in others]
        node.args = (tensors, numbers)
        rewritten += 1
    return rewritten


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
        try:
            if _lerp_as_add(gm) + _cpu_scalars_as_numbers(gm):
                gm.graph.lint()
                gm.recompile()
        except Exception as e:  # noqa: BLE001 - the graph as captured still runs
            _warn_once(f"neuron backend: a graph rewrite failed ({type(e).__name__}: {e}); "
                       "the graph runs as captured")
        return _region(gm.forward, autotune)
    try:
        import functools

        from torch._dynamo.backends.common import aot_autograd

        compiler = functools.partial(_boxed_region, autotune=autotune)
        return aot_autograd(fw_compiler=compiler, bw_compiler=compiler)(gm, example_inputs)
    except Exception as e:  # noqa: BLE001 - any failure of ours must not fail the user's run
        cause = f"{type(e).__name__}: {e}".splitlines()[0][:300]
        _warn_once(f"neuron backend: AOTAutograd could not take this graph ({cause}); "
                   "it runs as captured, op by op inside a compiled region")
        return _region(gm.forward, autotune)


def _warn_once(message):
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, stacklevel=3)
