"""Weight-only quantized decode kernels (CuTe DSL, Hopper), behind a switch that defaults to OFF.

`enabled()` is true when `use(True)` was called or the environment has DSV4_KERNELS=1. The
model's integration points (Linear.forward for FP8 weights, StaticMoE.expert_linear for FP4 and
NVFP4 expert banks) ask `dense_gemv` / `expert_gemv`, which return None whenever the kernels do
not apply (switch off, CPU tensors, float32 activations, unsupported shape or alignment, no
CuTe DSL installed): the caller then runs its pure-torch twin, so CPU behaviour never changes.

Nothing here imports cutlass: `launch` imports the CuTe modules only when a GPU kernel is about
to run, so the package imports and every CPU test passes without CUDA or the CuTe native libs.
"""

from __future__ import annotations

import os

import torch

__all__ = ["enabled", "use", "available", "expert_gemv", "dense_gemv",
           "fp4_grouped_gemv", "nvfp4_grouped_gemv", "fp8_gemv"]

_STATE: dict[str, bool | None] = {"forced": None}


def enabled() -> bool:
    """The switch: `use(flag)` wins over the environment variable DSV4_KERNELS (default off)."""
    if _STATE["forced"] is not None:
        return bool(_STATE["forced"])
    return os.environ.get("DSV4_KERNELS", "0").strip().lower() in ("1", "true", "yes", "on")


def use(flag: bool | None) -> None:
    """Turn the kernels on or off for this process; None goes back to the environment variable."""
    _STATE["forced"] = None if flag is None else bool(flag)


def available() -> bool:
    """CUDA present and the CuTe DSL importable (imports it: call only when about to run)."""
    if not torch.cuda.is_available():
        return False
    try:
        import cutlass.cute  # noqa: F401
    except Exception:  # missing package or native libraries
        return False
    return True


def fp4_grouped_gemv(x, weight, scale, idx, out=None):
    """y[r] = x[r] @ dequant(weight[idx[r]], scale[idx[r]])^T, fp32 [R, N] (CUDA only)."""
    from dsv4.kernels import launch

    return launch.fp4_grouped_gemv(x, weight, scale, idx, out)


def nvfp4_grouped_gemv(x, weight, scale, global_scale, idx, out=None):
    """NVFP4 twin of fp4_grouped_gemv: e4m3 scale per 16, fp32 global scale per expert."""
    from dsv4.kernels import launch

    return launch.nvfp4_grouped_gemv(x, weight, scale, global_scale, idx, out)


def fp8_gemv(x, weight, scale, out=None):
    """y = x @ dequant(weight, scale)^T with e4m3 weights and UE8M0 128x128 scales, fp32 [M, N]."""
    from dsv4.kernels import launch

    return launch.fp8_gemv(x, weight, scale, out)


def expert_gemv(fmt: str, x: torch.Tensor, bank: dict, idx: torch.Tensor) -> torch.Tensor | None:
    """The routed-expert kernel for StaticMoE, or None when the caller should use its twin."""
    if not enabled() or not x.is_cuda or fmt not in ("fp4", "nvfp4"):
        return None
    from dsv4.kernels import launch

    return launch.try_expert(fmt, x, bank, idx)


def dense_gemv(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor | None:
    """The FP8 dense kernel for Linear.forward (any leading dims), or None to use the twin."""
    if not enabled() or not x.is_cuda:
        return None
    from dsv4.kernels import launch

    return launch.try_dense(x, weight, scale)
