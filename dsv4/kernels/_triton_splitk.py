"""Deterministic split-K for the Triton GEMMs, finished inside the kernel: no reduction launch.

Why: a decode step's small-N GEMVs split K so the GPU gets enough programs, and the fixed-order
`torch.sum` over the splits that finished them was a launch of its own each time (H200, flash batch 1:
126 sums, 0.46 ms of a 12.5 ms step; with the Triton FP8 GEMM 362 sums, 1.1 ms).

Each split stores its fp32 partial tile to a workspace and counts itself in on a per-tile counter
(atomic add, acquire-release at GPU scope, after a CTA barrier so every thread's stores are ordered
before it). The program that arrives last sums the tile's partials in split order 0, 1, ... from L2
(`.cg` loads, four in flight at a time), writes the output and puts the counter back to zero for
the next launch or replay.
Which program arrives last varies; the order it sums in does not, so results are bitwise repeatable
and a graph replay equals the eager call.

Counters: one zeroed int32 buffer per device, made on first use outside graph capture (a call inside
a capture that finds none gets a zeroed temporary, one memset node in the graph). Launches on one
stream run one after another and leave the counters at zero; two of these kernels running at the same
time on two streams of one device would share counters, which this decode path never does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_COUNTERS: dict[torch.device, torch.Tensor] = {}
MIN_COUNTERS = 8192


@triton.jit
def store_tile(acc, y_ptr, ws_ptr, cnt_ptr, offs, mask, splits, split_stride):
    """acc (this program's partial tile) -> y at offs; with splits > 1 through the workspace, the
    last of the tile's split programs summing them in split order."""
    if splits == 1:
        tl.store(y_ptr + offs, acc, mask=mask)
    else:
        tl.store(ws_ptr + tl.program_id(2) * split_stride + offs, acc, mask=mask)
        tl.debug_barrier()  # every thread's partial is stored before the count below
        tile = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
        arrived = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == splits - 1:
            total = tl.zeros_like(acc)
            for s0 in range(0, splits, 4):  # four partials in flight per round trip, added in split order
                p0 = _partial(ws_ptr, offs, mask, s0, splits, split_stride)
                p1 = _partial(ws_ptr, offs, mask, s0 + 1, splits, split_stride)
                p2 = _partial(ws_ptr, offs, mask, s0 + 2, splits, split_stride)
                p3 = _partial(ws_ptr, offs, mask, s0 + 3, splits, split_stride)
                total = (((total + p0) + p1) + p2) + p3
            tl.store(y_ptr + offs, total, mask=mask)
            tl.atomic_xchg(cnt_ptr + tile, 0)


@triton.jit
def store_small_tile(acc, y_ptr, ws_ptr, cnt_ptr, offs, mask, splits, split_stride, CHUNK: tl.constexpr):
    """store_tile for a small tile split many ways (a reduction that needs 64+ programs to stream its
    operand, e.g. the mHC mixes): the last program loads CHUNK partials per round trip as one
    [CHUNK, tile] block and reduces it with a fixed tree (tl.sum), the chunks added in order."""
    if splits == 1:
        tl.store(y_ptr + offs, acc, mask=mask)
    else:
        tl.store(ws_ptr + tl.program_id(2) * split_stride + offs, acc, mask=mask)
        tl.debug_barrier()
        tile = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
        arrived = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == splits - 1:
            total = tl.zeros_like(acc)
            for s0 in range(0, splits, CHUNK):
                sp = s0 + tl.arange(0, CHUNK)
                part = tl.load(ws_ptr + sp[:, None, None] * split_stride + offs[None, :, :],
                               mask=(sp < splits)[:, None, None] & mask[None, :, :], other=0.0, cache_modifier=".cg")
                total += tl.sum(part, axis=0)
            tl.store(y_ptr + offs, total, mask=mask)
            tl.atomic_xchg(cnt_ptr + tile, 0)


@triton.jit
def _partial(ws_ptr, offs, mask, s, splits, split_stride):
    """Split s's stored partial from L2 (zeros past the last split: adding them changes nothing)."""
    p = tl.load(ws_ptr + tl.minimum(s, splits - 1) * split_stride + offs, mask=mask, other=0.0, cache_modifier=".cg")
    return tl.where(s < splits, p, 0.0)


def counters(device: torch.device, tiles: int) -> torch.Tensor:
    """The device's zeroed counters (at least `tiles`); inside a capture that has none yet, a zeroed
    temporary (stream-ordered like any other allocation of the capture)."""
    buf = _COUNTERS.get(device)
    if buf is None or buf.numel() < tiles:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return torch.zeros(tiles, dtype=torch.int32, device=device)
        buf = torch.zeros(max(tiles, MIN_COUNTERS), dtype=torch.int32, device=device)
        _COUNTERS[device] = buf
    return buf


def workspace(y: torch.Tensor, grid: tuple[int, int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(ws, counters) for a launch of `grid` (N tiles, M tiles, splits) writing y [M, N] (rows
    contiguous): ws holds one [M, N] slab per split with y's row stride, so one offset serves both
    (store_tile's split_stride is ws.stride(0)). With one split neither is read: (y, y as int32)."""
    if y.dim() != 2 or y.stride(1) != 1:
        raise ValueError(f"split-K output: want a 2-D tensor with contiguous rows, got stride {y.stride()}")
    if grid[2] == 1:
        return y, y.view(torch.int32)
    M, N = y.shape
    ws = torch.empty(grid[2], M, max(y.stride(0), N), dtype=torch.float32, device=y.device)[:, :, :N]
    return ws, counters(y.device, grid[0] * grid[1])
