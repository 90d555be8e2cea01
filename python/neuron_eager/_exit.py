"""A clean interpreter exit after backward passes on `neuron`.

Backward work on a device runs on autograd's device thread (as on CUDA). torch 2.13
stashes a Python object (a contextvars copy) in the thread-local state every backward's
GraphTask carries, and the device thread may drop the last reference to a finished
GraphTask just after the caller returned. If the interpreter is finalizing by then, the
drop takes the GIL from a thread Python is tearing down, and the process aborts with
"terminate called without an active exception" (seen in about 1 in 15 short scripts that
end right after a backward).

At exit, while the interpreter still runs, one tiny backward goes through the engine
directly (without that stash and with no result returned, so its own GraphTask holds no
Python object): the device
thread handles it after every earlier task, so by the time it returns every earlier
GraphTask has been dropped, with the GIL available.
"""

import atexit

import torch


def _drain_autograd_device_threads() -> None:
    try:
        from . import _device

        if not _device.is_initialized():
            return
        leaf = torch.zeros(1, device="neuron", requires_grad=True)
        out = leaf * 1.0  # its backward runs on the neuron autograd thread
        # Gradients accumulate into leaf.grad: the GraphTask's result holds no tensor
        # that Python has seen (its drop needs no GIL either).
        torch.autograd.Variable._execution_engine.run_backward(
            (out,), (torch.ones_like(out),), False, False, (), True, True)
    except Exception:  # noqa: BLE001 - exiting: nothing worth an error here
        pass


def register() -> None:
    atexit.register(_drain_autograd_device_threads)
