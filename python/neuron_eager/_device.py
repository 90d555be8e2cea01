"""torch.neuron: the device module of the `neuron` backend."""

import contextlib
from typing import Any, Optional, Union

import torch

from . import _C

_DeviceLike = Union[int, str, torch.device, None]


def _index(device: _DeviceLike = None) -> int:
    if device is None:
        return _C.current_device()
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "neuron":
            raise ValueError(f"neuron: expected a neuron device, got {device}")
        return _C.current_device() if device.index is None else device.index
    raise TypeError(f"neuron: expected a device index, string or torch.device, got {device!r}")


def is_available() -> bool:
    return _C.device_count() > 0


def is_initialized() -> bool:
    return True


def _lazy_init() -> None:
    pass


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    return _C.device_count()


def current_device() -> int:
    return _C.current_device()


def set_device(device: _DeviceLike) -> None:
    _C.set_device(_index(device))


def get_device_name(device: _DeviceLike = None) -> str:
    return f"NeuronCore simulator (neuron:{_index(device)})"


def get_amp_supported_dtype():
    return [torch.float16, torch.bfloat16]


class _DeviceProperties:
    """What torch.cuda.get_device_properties gives that applies to a NeuronCore simulator."""

    def __init__(self, index: int):
        self.name = get_device_name(index)
        self.total_memory = _C.memory_stats(index)["hbm_capacity_bytes"]
        self.index = index

    def __repr__(self) -> str:
        return f"_NeuronDeviceProperties(name={self.name!r}, total_memory={self.total_memory // 2**20}MB)"


def get_device_properties(device: _DeviceLike = None) -> _DeviceProperties:
    return _DeviceProperties(_index(device))


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """bfloat16 runs natively (ATen's CPU kernels take it); transformers asks this for bf16=True."""
    return is_available()


class device:
    """Context manager that makes `device` current inside the block."""

    def __init__(self, device: _DeviceLike):
        self.idx = _index(device)
        self.prev = -1

    def __enter__(self):
        self.prev = _C.current_device()
        _C.set_device(self.idx)

    def __exit__(self, *args: Any):
        _C.set_device(self.prev)
        return False


class device_of(device):
    def __init__(self, obj):
        super().__init__(obj.device if obj.device.type == "neuron" else None)


def synchronize(device: _DeviceLike = None) -> None:
    """Waits for all queued work on the core; raises if an async op failed."""
    _C.synchronize(_index(device))


# ---- streams and events -------------------------------------------------------

def Stream(device: _DeviceLike = None, priority: int = 0) -> torch.Stream:
    """A new stream (a FIFO queue with its own worker) on a neuron core."""
    return torch.Stream(device=torch.device("neuron", _index(device)), priority=priority)


def Event(enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
    return torch.Event(device="neuron", enable_timing=enable_timing, blocking=blocking,
                       interprocess=interprocess)


def current_stream(device: _DeviceLike = None) -> torch.Stream:
    idx = _index(device)
    return torch.Stream(stream_id=_C.current_stream_id(idx), device_index=idx,
                        device_type=torch._C._autograd.DeviceType.PrivateUse1.value
                        if hasattr(torch._C._autograd, "DeviceType") else 20)


def default_stream(device: _DeviceLike = None) -> torch.Stream:
    idx = _index(device)
    return torch.Stream(stream_id=0, device_index=idx, device_type=_current_type_code())


def _current_type_code() -> int:
    return current_stream(0).device_type


def set_stream(stream: torch.Stream) -> None:
    _C.set_stream(stream.device_index, stream.stream_id)


@contextlib.contextmanager
def stream(s: Optional[torch.Stream]):
    """Makes s the current stream of its core inside the block."""
    if s is None:
        yield
        return
    prev = _C.current_stream_id(s.device_index)
    _C.set_stream(s.device_index, s.stream_id)
    try:
        yield
    finally:
        _C.set_stream(s.device_index, prev)


# ---- random numbers -----------------------------------------------------------

default_generators = tuple(_C.default_generator(i) for i in range(_C.device_count()))


def _generator(device: _DeviceLike = None) -> torch.Generator:
    return default_generators[_index(device)]


def manual_seed(seed: int) -> None:
    _generator().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for g in default_generators:
        g.manual_seed(int(seed))


def seed() -> None:
    _generator().seed()


def seed_all() -> None:
    s = _generator(0).seed()
    for g in default_generators[1:]:
        g.manual_seed(s)


def initial_seed() -> int:
    return _generator().initial_seed()


def get_rng_state(device: _DeviceLike = "neuron") -> torch.Tensor:
    return _generator(device).get_state()


def set_rng_state(new_state: torch.Tensor, device: _DeviceLike = "neuron") -> None:
    _generator(device).set_state(new_state)


def get_rng_state_all():
    return [g.get_state() for g in default_generators]


def set_rng_state_all(new_states) -> None:
    for g, s in zip(default_generators, new_states):
        g.set_state(s)


# ---- memory ---------------------------------------------------------------------

def memory_stats(device: _DeviceLike = None) -> dict:
    return dict(sorted(_C.memory_stats(_index(device)).items()))


def memory_allocated(device: _DeviceLike = None) -> int:
    return _C.memory_stats(_index(device))["allocated_bytes.all.current"]


def max_memory_allocated(device: _DeviceLike = None) -> int:
    return _C.memory_stats(_index(device))["allocated_bytes.all.peak"]


def memory_reserved(device: _DeviceLike = None) -> int:
    return _C.memory_stats(_index(device))["reserved_bytes.all.current"]


def max_memory_reserved(device: _DeviceLike = None) -> int:
    return _C.memory_stats(_index(device))["reserved_bytes.all.peak"]


def reset_peak_memory_stats(device: _DeviceLike = None) -> None:
    _C.reset_peak_memory_stats(_index(device))


def reset_accumulated_memory_stats(device: _DeviceLike = None) -> None:
    _C.reset_accumulated_memory_stats(_index(device))


def empty_cache() -> None:
    _C.empty_cache()


def mem_get_info(device: _DeviceLike = None):
    stats = _C.memory_stats(_index(device))
    total = stats["hbm_capacity_bytes"]
    return total - stats["reserved_bytes.all.current"], total
