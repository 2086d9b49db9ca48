"""Pure-torch twins of the weight-only GEMV kernels in dsv4/kernels (any device, graph-safe).

Each twin is the plain definition: dequantize with quantize.py's dequantizers to fp32, then an
fp32 matmul. The kernels must compute the same function up to fp32 summation order; the twins
are themselves checked against float64 on fresh random data (tests/test_kernels.py).

Shapes (R rows = tokens x top-k for the grouped ones, M rows for the dense one):
- fp4_grouped_gemv_ref(x [R,K], weight [E,N,K/2] int8, scale [E,N,K/32] e8m0, idx [R]) -> [R,N]
- nvfp4_grouped_gemv_ref(x, weight [E,N,K/2], scale [E,N,K/16] e4m3, global_scale [E], idx)
- fp8_gemv_ref(x [M,K], weight [N,K] e4m3, scale [ceil(N/128), ceil(K/128)] e8m0) -> [M,N];
  with groups G: x [M*G,K], output rows [g*N/G, (g+1)*N/G) read x row m*G + g (wo_a)
- bf16_gemv_ref(x [M,K] fp32, weight [N,K] bf16) -> [M,N] (the released fp32 math on bf16 weights)
x is used as given (callers pass the FP8-fake-quantized bf16 activation); the output is fp32.
"""

from __future__ import annotations

import torch

from dsv4.ops import quantize as Q

__all__ = ["fp4_grouped_gemv_ref", "nvfp4_grouped_gemv_ref", "fp8_gemv_ref", "bf16_gemv_ref"]


def _rows(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """[R, N, K] fp32 weights times [R, K] -> [R, N] fp32."""
    return torch.bmm(w, x.float().unsqueeze(-1)).squeeze(-1)


def fp4_grouped_gemv_ref(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                         idx: torch.Tensor) -> torch.Tensor:
    w = Q.dequantize_fp4(weight.index_select(0, idx), scale.index_select(0, idx))
    return _rows(x, w)


def nvfp4_grouped_gemv_ref(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                           global_scale: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    g = global_scale.reshape(-1).index_select(0, idx)[:, None, None]
    w = Q.dequantize_nvfp4(weight.index_select(0, idx), scale.index_select(0, idx), g)
    return _rows(x, w)


def fp8_gemv_ref(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, groups: int = 1) -> torch.Tensor:
    w = Q.dequantize_fp8_blockwise(weight, scale)
    if groups == 1:
        return x.float() @ w.t()
    xg = x.float().unflatten(0, (-1, groups))  # [M, G, K]; group g owns rows g*N/G.. of the weight
    return torch.einsum("mgk,gnk->mgn", xg, w.unflatten(0, (groups, -1))).flatten(1)


def bf16_gemv_ref(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x.float() @ weight.float().t()
