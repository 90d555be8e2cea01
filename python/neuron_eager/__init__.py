"""neuron-eager: the `neuron` PyTorch device on a simulated NeuronCore.

Importing this package (or plain `import torch`, through the `torch.backends` entry
point) registers PrivateUse1 as `neuron` and installs the `torch.neuron` module.
"""



def _autoload() -> None:
    """Entry point of the `torch.backends` group. Defined before `import torch`: when this
    package is imported first, torch's autoload finds it here while we are half loaded,
    and the registration below runs once torch is ready."""


import torch  # noqa: E402

from . import _C  # noqa: E402

_C._init()  # parses NEURON_* and raises ValueError naming a bad value

if torch._C._get_privateuse1_backend_name() != "neuron":
    torch.utils.rename_privateuse1_backend("neuron")

from . import _device  # noqa: E402

torch._register_device_module("neuron", _device)

from . import _distributed  # noqa: E402

_distributed.register()  # the "neuron" torch.distributed backend for neuron tensors

from . import _exit  # noqa: E402

_exit.register()  # no abort at exit right after a backward (see _exit.py)

from . import _safetensors  # noqa: E402

_safetensors.install()  # safetensors.torch.load_file(..., device="neuron") (see _safetensors.py)

if not hasattr(torch.Tensor, "is_neuron"):
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
    )

MODES = ("eager", "adaptive")


def get_mode() -> str:
    """The execution mode: 'eager' (per op) or 'adaptive' (fused hot segments)."""
    return _C.get_mode()


def set_mode(mode: str) -> None:
    """Selects 'eager' or 'adaptive'; anything else raises ValueError."""
    _C.set_mode(mode)


def launch_blocking() -> bool:
    """Whether every op waits for its execution (NEURON_LAUNCH_BLOCKING=1)."""
    return _C.launch_blocking()


def set_launch_blocking(on: bool) -> None:
    _C.set_launch_blocking(bool(on))


def pending_work(device=None) -> int:
    """Work items queued on the core and not yet finished."""
    return _C.pending_work(_device._index(device))


def counters() -> dict:
    """Engine counters: ops dispatched, queued, run synchronously, shape-cache hits..."""
    return _C.counters()


def reset_counters() -> None:
    _C.reset_counters()


def reset_fusion_state() -> None:
    """Forgets every recorded segment, fused program and fusion decision of this process
    (as torch._dynamo.reset() does for torch.compile): later loops start cold. Kernels in
    the on-disk cache stay."""
    _C.reset_fusion_state()


__all__ = ["get_mode", "set_mode", "launch_blocking", "set_launch_blocking", "pending_work",
           "counters", "reset_counters", "reset_fusion_state", "MODES", "get_policy", "set_policy"]


def get_policy() -> dict:
    """The fusion policy in force, every knob by name."""
    import json

    return json.loads(_C.policy_json())


def set_policy(policy) -> None:
    """Selects the fusion policy: a built-in name (default, aggressive, conservative,
    never), a policy file path, or a dict of knobs (optionally with "base": NAME).
    A bad policy raises ValueError naming the key and the allowed values."""
    import os

    if isinstance(policy, dict):
        values = dict(policy)
        base = str(values.pop("base", "default"))
        items = []
        for key, value in values.items():
            if isinstance(value, bool):
                value = "true" if value else "false"
            elif isinstance(value, (list, tuple)):
                value = ",".join(str(v) for v in value)
            items.append((str(key), str(value)))
        _C.set_policy_values(base, items)
    elif isinstance(policy, str) and policy in _C.builtin_policies():
        _C.set_policy_builtin(policy)
    elif isinstance(policy, (str, os.PathLike)):
        _C.set_policy_file(os.fspath(policy))
    else:
        raise TypeError(f"neuron: set_policy expects a built-in name, a path or a dict, got {policy!r}")


def _finish_at_exit() -> None:
    """At interpreter exit: run what is queued and close a trace NEURON_TRACE started."""
    try:
        _C.synchronize(-1)
    except Exception:  # an async error nobody synced for; the trace still closes
        pass
    if _C.trace_active():
        _C.trace_stop()


import atexit  # noqa: E402

atexit.register(_finish_at_exit)
