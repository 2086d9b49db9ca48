"""Programmatic dependent launch (PDL) for our Triton and CuTe kernels, on Hopper and later.

Why: a batch-1 decode step is ~85 launches a layer, most a few microseconds long, and inside a CUDA
graph each one still pays its grid's launch and ramp-up after the previous grid has drained. With PDL
a kernel is launched while the previous one still runs and blocks in `griddepcontrol.wait` until that
grid has completed and its writes are visible: the launch overlaps the previous kernel's tail, and
nothing it reads can be stale.

The rule every kernel launched this way keeps: it waits (`pdl_wait(PDL)`) before it loads anything an
earlier kernel wrote and before its first store, and signals `launch_dependents` right after, so the
chain stays transitive: a kernel completes only after its predecessor did, and a later kernel that
reads an older kernel's output never races it. The one exception is a parameter (read-only in the
step): the CuTe FP8 GEMV issues its first weight chunks before it waits, and the Triton bf16 GEMV and the
mHC mixes kernel load their first weight tile before it, so those bytes stream while the previous
kernel finishes (_cute_gemv.py, _triton_gemv.py, _triton_mixes.py). Every other load comes after the wait. Inductor's kernels follow the same rule with
`torch._inductor.config.triton.enable_pdl` (dsv4/decode/fuse.py). Kernels launched without PDL
(cuBLAS) start after everything before them, as usual.

DSV4_PDL=0 turns it off (the bench records the setting); the Triton interpreter and GPUs before
sm_90 never use it.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from dsv4 import kernels

try:  # Triton >= 3.3
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - older Triton: PDL stays off
    gdc_wait = gdc_launch_dependents = None


@functools.cache
def _capable(index: int) -> bool:
    return gdc_wait is not None and torch.cuda.get_device_capability(index)[0] >= 9


def applies(t: torch.Tensor) -> bool:
    """Whether a launch on t's device uses PDL."""
    return (kernels.pdl() and t.is_cuda and os.environ.get("TRITON_INTERPRET", "0") != "1"
            and _capable(t.device.index if t.device.index is not None else torch.cuda.current_device()))


def launch_args(t: torch.Tensor) -> dict:
    """Keyword arguments of a Triton launch on t's device: the kernel's PDL constexpr, and the launch
    attribute where PDL applies."""
    return {"PDL": True, "launch_pdl": True} if applies(t) else {"PDL": False}


def weight_args(t: torch.Tensor) -> dict:
    """launch_args for a kernel that may load its first weight tile ahead of the wait (PREFETCH): where
    PDL applies, unless DSV4_PREFETCH=0 (an A/B switch the bench records)."""
    args = launch_args(t)
    off = os.environ.get("DSV4_PREFETCH", "1").strip().lower() in ("0", "false", "no", "off")
    return args | {"PREFETCH": args["PDL"] and not off}


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """A PDL kernel's first statement: wait for the previous grid, then let the next one launch."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
