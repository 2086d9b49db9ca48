"""Device queries a step written for the GPU makes, answered on a machine without CUDA.

Kernel wrappers ask about the device on every call: `with torch.cuda.device(x.device):` around a Triton
launch, `torch.cuda.current_device()` to key a workspace, `torch.cuda.get_device_capability()` to pick an FP8
path, `torch.cuda.get_device_properties(d).multi_processor_count` to size a grid. On a GPU these read host-side
driver state: no stream work, legal under capture, no finding. A CPU-only torch raises on each of them, which
stopped a CPU scan at that line. While a step runs (warmup included) they stand in, beside audit.scan.standins.cpu_cuda's
streams and events, answering as one Hopper GPU would (device 0, capability (9, 0)); nothing is recorded.
torch's private internals (`torch._inductor`, `torch._dynamo`, ...) asking get the real answer of the CPU-only
torch instead: a function `torch.compile`d in warmup is compiled for this machine, and inductor keys its cache
on the device it finds (`get_device_properties(current_device())`, which it expects to raise without CUDA).
"""

from __future__ import annotations

import contextlib
import sys
from types import SimpleNamespace

import torch

__all__ = ["stand_ins"]

PROPS = SimpleNamespace(name="stand-in GPU (CPU scan)", major=9, minor=0, multi_processor_count=132,
                        total_memory=141 * 2**30, max_threads_per_multi_processor=2048, warp_size=32,
                        L2_cache_size=50 * 2**20, is_integrated=False, is_multi_gpu_board=False)


class _Device(contextlib.AbstractContextManager):
    """`torch.cuda.device(d)` / `torch.cuda.device_of(t)`: the current device switch, a no-op here."""

    def __init__(self, device=None):
        self.idx = 0

    def __exit__(self, *exc) -> bool:
        return False


def _outside_torch_internals(real, fake):
    """`fake` for the step's code (and torch's public helpers it calls); `real` for a caller in a private
    torch module (`torch._inductor.codecache`), which compiles for the machine it runs on."""
    def query(*args, **kwargs):
        caller = sys._getframe(1).f_globals.get("__name__", "")
        return (real if caller.startswith("torch._") else fake)(*args, **kwargs)
    return query


def stand_ins() -> list:
    """(owner, name, new) for the patches `cpu_cuda.standing_in` installs for one step."""
    cuda = torch.cuda
    queries = [("current_device", lambda: 0), ("set_device", lambda device: None),
               ("get_device_capability", lambda device=None: (PROPS.major, PROPS.minor)),
               ("get_device_name", lambda device=None: PROPS.name),
               ("get_device_properties", lambda device=None: PROPS)]
    return [(cuda, "device", _Device), (cuda, "device_of", _Device),
            *((cuda, name, _outside_torch_internals(getattr(cuda, name), fake)) for name, fake in queries)]
