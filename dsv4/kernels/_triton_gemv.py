"""bf16-weight GEMV with fp32 activations and fp32 accumulation, in Triton.

The released model runs its bf16 weights in fp32: the LM head (129280 x 4096, a gigabyte read
every token), the compressors' wkv/wgate, the indexer's weights_proj, the MoE gate. The twin
(`x.float() @ w.float().t()`) materializes an fp32 copy of the weight every step, writing twice
the bytes it reads; this kernel reads each bf16 weight once and widens it in registers.

Deterministic by construction: no atomics. When N is too small to give the GPU enough programs
(compressors, gate, weights_proj: a few hundred rows of K = 4096; the H200 profile showed ~31 us per
such launch, latency-bound with a few KB in flight per SM), K is split: each split writes its
partial sums to a workspace and one fixed-order sum over the splits finishes, so a graph replay is
bitwise equal to the eager call. Imported lazily (Triton
is not needed on CPU machines); run under TRITON_INTERPRET=1 the tests check it on the CPU.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

ELEMS = 8192  # products held in registers per program and K step (BLOCK_M * BLOCK_N * BLOCK_K)
TARGET_PROGRAMS = 264  # ~2 per SM of an H100/H200: enough bytes in flight to stream the weight


@triton.jit
def _bf16_gemv_kernel(x_ptr, w_ptr, y_ptr, M, N, K, K_PER_SPLIT, sxm, swn, sym, sys,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_s = tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_begin = pid_s * K_PER_SPLIT
    k_end = tl.minimum(k_begin + K_PER_SPLIT, K)
    y_ptr += pid_s * sys
    for k0 in range(k_begin, k_end, BLOCK_K):
        kk = k0 + rk
        x = tl.load(x_ptr + rm[:, None] * sxm + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < k_end), other=0.0)
        w = tl.load(w_ptr + rn[:, None] * swn + kk[None, :], mask=(rn[:, None] < N) & (kk[None, :] < k_end), other=0.0)
        acc += tl.sum(x[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)
    tl.store(y_ptr + rm[:, None] * sym + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def tiles(M: int, N: int, K: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, splits): all rows of a decode batch in one program, BLOCK_N as wide
    as the register budget allows, and K split until the grid has ~TARGET_PROGRAMS programs (each
    split keeps at least two BLOCK_K steps)."""
    bm = min(triton.next_power_of_2(max(M, 1)), 16)
    bk = 128 if K >= 128 else triton.next_power_of_2(K)
    bn = min(max(ELEMS // (bm * bk), 1), triton.next_power_of_2(N))
    programs = triton.cdiv(N, bn) * triton.cdiv(M, bm)
    splits = max(1, min(triton.cdiv(TARGET_PROGRAMS, programs), triton.cdiv(K, bk) // 2))
    return bm, bn, bk, splits


def bf16_gemv(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] fp32, w [N, K] bf16 (rows contiguous) -> fp32 [M, N] on the current stream."""
    M, K = x.shape
    N = w.shape[0]
    if w.shape[1] != K or x.dtype != torch.float32 or w.dtype != torch.bfloat16:
        raise ValueError(f"bf16_gemv: x {x.dtype} {tuple(x.shape)}, w {w.dtype} {tuple(w.shape)}")
    if x.stride(1) != 1:
        x = x.contiguous()
    if w.stride(1) != 1:
        w = w.contiguous()
    y = out if out is not None else torch.empty(M, N, dtype=torch.float32, device=x.device)
    bm, bn, bk, splits = tiles(M, N, K)
    per = triton.cdiv(triton.cdiv(K, bk), splits) * bk  # K per split, whole BLOCK_K steps
    splits = triton.cdiv(K, per)
    ws = y if splits == 1 else torch.empty(splits, M, N, dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(N, bn), triton.cdiv(M, bm), splits)
    with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext():
        _bf16_gemv_kernel[grid](x, w, ws, M, N, K, per, x.stride(0), w.stride(0), ws.stride(-2),
                                ws.stride(0) if splits > 1 else 0, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=4)
        if splits > 1:
            torch.sum(ws, dim=0, out=y)  # fixed order: deterministic
    return y
