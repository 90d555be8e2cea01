"""safetensors' loader on `neuron`. Its Rust side accepts only the device types it knows
("device neuron is invalid"), while libraries ask it for the device they detect: peft
0.22's `infer_device()` returns `torch.accelerator.current_accelerator().type`, so
`PeftModel.from_pretrained(model_on_neuron, path)` calls
`safetensors.torch.load_file(path, device="neuron")`. `load_file` learns the `neuron`
device: it reads on CPU and moves the tensors there (the bits are the file's). Installed when `safetensors.torch` is first
imported (an import hook: peft binds `load_file` by name at its own import, so a later
patch would not reach it), or at once if it is imported already."""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys

import torch

_MODULE = "safetensors.torch"


def _on_neuron(device) -> bool:
    if isinstance(device, torch.device):
        return device.type == "neuron"
    return isinstance(device, str) and device.split(":")[0] == "neuron"


def _patch(module) -> None:
    if getattr(module, "_neuron_patched", False):
        return
    load_file = getattr(module, "load_file", None)
    if load_file is not None:
        @functools.wraps(load_file)
        def load_file_on_neuron(filename, device="cpu", *args, **kwargs):
            if not _on_neuron(device):
                return load_file(filename, device, *args, **kwargs)
            tensors = load_file(filename, "cpu", *args, **kwargs)
            return {name: t.to(device) for name, t in tensors.items()}
        module.load_file = load_file_on_neuron
    module._neuron_patched = True


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


def install() -> None:
    if _MODULE in sys.modules:
        _patch(sys.modules[_MODULE])
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
