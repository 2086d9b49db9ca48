"""Planted: an external kernel launched on a stream cached at init (uncaptured-kernel).

During capture the kernel runs eagerly on its own stream and is not a graph node; replay skips it
and raises nothing (measured on an H200 with CuTe DSL, docs/hazards.md). Three launchers, one factory
each: `make_cute` (CuTe DSL), `make_triton` (Triton under a cached torch stream), `make_cupy`
(a cupy RawKernel on a cached cupy stream). A factory raises ImportError when its library is missing.
"""

import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from planted_common import BATCH, D, Target  # noqa: E402


def cupy_launcher(src: torch.Tensor, dst: torch.Tensor):
    import cupy

    dev = src.device.index or 0
    with cupy.cuda.Device(dev):
        stream = cupy.cuda.Stream(non_blocking=True)  # cached: the hazard
        kernel = cupy.RawKernel(r'''
        extern "C" __global__ void twice(const float* x, float* y, int n) {
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < n) y[i] = 2.0f * x[i];
        }''', "twice")
        xs, ys = cupy.from_dlpack(src), cupy.from_dlpack(dst)  # wrapped once, outside any capture
    n = src.numel()

    def launch():
        with cupy.cuda.Device(dev), stream:
            kernel(((n + 127) // 128,), (128,), (xs, ys, cupy.int32(n)))

    return launch


def triton_launcher(src: torch.Tensor, dst: torch.Tensor):
    from triton_twice import twice

    stream = torch.cuda.Stream(device=src.device)  # cached: the hazard
    n = src.numel()

    def launch():
        with torch.cuda.stream(stream):
            twice[((n + 127) // 128,)](src, dst, n, BLOCK=128)

    return launch


def cute_launcher(src: torch.Tensor, dst: torch.Tensor):
    import cuda.bindings.driver as cuda
    from cutlass.cute.runtime import from_dlpack

    import cute_twice

    stream = torch.cuda.Stream(device=src.device)  # cached: the hazard
    cu_stream = cuda.CUstream(stream.cuda_stream)
    a, b = from_dlpack(src, assumed_align=16), from_dlpack(dst, assumed_align=16)
    with torch.cuda.device(src.device):
        compiled = cute_twice.compile(a, b, cu_stream)

    def launch():
        compiled(a, b, cu_stream)

    return launch


LAUNCHERS = {"cupy": cupy_launcher, "triton": triton_launcher, "cute": cute_launcher}


class SideKernel(nn.Module):
    """y = h + 2 * h, the doubling done by an external kernel on a cached stream."""

    def __init__(self, backend: str, device):
        super().__init__()
        self.src = torch.zeros(BATCH, D, device=device)  # static buffers for the external kernel
        self.dst = torch.zeros(BATCH, D, device=device)
        self.launch = LAUNCHERS[backend](self.src, self.dst)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        self.src.copy_(h)
        self.launch()  # PLANT: launched on a stream cached at init
        return h + self.dst


def _make(backend: str):
    def make(device):
        return Target(device, ("side", SideKernel(backend, torch.device(device))))

    make.__name__ = f"make_{backend}"
    return make


make_cupy = _make("cupy")
make_triton = _make("triton")
make_cute = _make("cute")
