"""torch.distributed on `neuron`: the "neuron" process-group backend.

Registered for the `neuron` device when the package loads, so `init_process_group()` with
no backend (the accelerator's default), `"neuron"` or `"cpu:gloo,neuron:neuron"` give
neuron tensors to it. Collectives queue on the core's collective stream like ops; the
bytes move through torch's own ProcessGroupGloo on CPU aliases of device memory (over TCP,
so the same torchrun command works across hosts).
"""

import functools

import torch.distributed as dist

from . import _C

BACKEND_NAME = "neuron"


def _create_backend(options, _backend_options=None):
    """torch.distributed's creator (extended API): a Gloo group on this backend's own
    prefix of the store carries the bytes."""
    host = dist.ProcessGroupGloo(options.store, options.group_rank, options.group_size, options.timeout)
    return _C._process_group_backend(host, options.group_rank, options.group_size)


def _fix_default_backend(pg) -> None:
    """torch 2.13 gives a group made with no backend name the default backend type GLOO
    unless it holds NCCL, even when the accelerator's custom backend is its only one (DDP's
    logger then fails with "Could not find backend type 1"), and a "cpu:gloo,neuron:neuron"
    group none at all. Such a group's default is ours."""
    if type(pg) is not dist.ProcessGroup:
        return
    types = {d.type for d in pg._device_types}
    if "neuron" not in types:
        return
    name = pg._get_backend_name()
    # "cpu:gloo,neuron:neuron" leaves it undefined (torch compares plugin names in upper case).
    if name == "undefined" or (name == "gloo" and "cpu" not in types):
        pg._set_default_backend(dist.ProcessGroup.BackendType.CUSTOM)


def _wrap_group_helper() -> None:
    from torch.distributed import distributed_c10d as c10d

    helper = c10d._new_process_group_helper
    if getattr(helper, "_neuron_wrapped", False):
        return

    @functools.wraps(helper)
    def wrapper(*args, **kwargs):
        result = helper(*args, **kwargs)
        _fix_default_backend(result[0] if isinstance(result, tuple) else result)
        return result

    wrapper._neuron_wrapped = True
    c10d._new_process_group_helper = wrapper


def register() -> None:
    """Registers the "neuron" backend for device type `neuron` (once per process)."""
    if not dist.is_available() or not dist.is_gloo_available():
        return
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create_backend, extended_api=True, devices=["neuron"])
    _wrap_group_helper()
