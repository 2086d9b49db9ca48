"""Row-wise top-k of fp32 as one Triton launch (the MoE gate's 6 of 32, the indexer's 512 of n/4).

torch.topk in a decode step costs ~1 ms over 122 launches: radixSortKVInPlace (the indexer's
512 of thousands, ~21 us each) and gatherTopK (~6.4 us each). Here one program per row, no sort:
  * keys: fp32 bits -> uint32 whose unsigned order is the float order (negatives flipped, the sign
    bit set on positives). -0.0 ranks just below +0.0; NaN never occurs in these inputs (not handled).
  * n <= RANK_MAX (the gate): each element's rank (larger keys, or equal keys at lower indices,
    before it) from one [n, n] comparison; the k of rank < k are the answer.
  * otherwise radix select: the k-th largest key T, 2 bits per step (<= 16 steps, fewer once
    exactly k keys are >= the bound: ~9 at n = 4096 for random values), the counts of keys >= the
    three candidates packed into 21-bit fields of one int64 sum (n < 2**21). The row stays in
    registers while n <= BLOCK_MAX (a row just past a power of two as that power plus a small tail
    block: 4,132 keys as 4,096 + 64); longer rows are re-read chunk by chunk (L1/L2) each step.
    Then compaction: every key > T, plus the first k - count(> T) keys == T in index order, each
    placed by a prefix sum. With k == n (the indexer on a short cache) the search is skipped.
Output: values [R, k] fp32 and indices [R, k] int64 in ascending index order (not sorted by value).
Ties at the k-th value (e.g. many -inf when fewer than k are visible) go to the lowest indices, so the
result is a function of the input alone: bitwise deterministic, in eager runs and graph replays.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from dsv4.kernels._pdl import launch_args, pdl_wait

RANK_MAX = 64  # n up to this: the rank kernel (one [n, n] comparison)
BLOCK_MAX = 8192  # n up to this: the row stays in registers; above, chunks of this size are re-read
MAX_N = (1 << 21) - 1  # the packed 21-bit counts
TAIL_MAX_FRACTION = 4  # a second block of at most a quarter of the first (else one block of the next power)


@triton.jit
def _keys(x_ptr, offs, n):
    """fp32 at offs (masked to < n) -> order-preserving uint32 keys; padding gets 0, below every float."""
    b = tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.uint32, bitcast=True)
    key = tl.where((b >> 31) != 0, b ^ 0xFFFFFFFF, b | 0x80000000)  # ^ not ~: Triton 3.8's interpreter overflows on ~uint32
    return tl.where(offs < n, key, 0)


@triton.jit
def _value(key):
    """The inverse of _keys: the fp32 a key came from."""
    b = tl.where((key >> 31) != 0, key ^ 0x80000000, key ^ 0xFFFFFFFF)
    return b.to(tl.float32, bitcast=True)


@triton.jit(do_not_specialize=["k"])
def _topk_rank_kernel(x_ptr, v_ptr, i_ptr, n, k, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    key = _keys(x_ptr + row * n, offs, n)
    ki = key[:, None]
    kj = key[None, :]
    before = (kj > ki) | ((kj == ki) & (offs[None, :] < offs[:, None]))
    rank = tl.sum((before & (offs[None, :] < n)).to(tl.int32), axis=1)
    sel = (rank < k) & (offs < n)
    slot = tl.cumsum(sel.to(tl.int32), axis=0) - 1
    tl.store(v_ptr + row * k + slot, _value(key), mask=sel)
    tl.store(i_ptr + row * k + slot, offs.to(tl.int64), mask=sel)


@triton.jit
def _counts3(key, thr, s):
    """The counts of keys >= the three candidates thr | j << s (j = 1..3), in 21-bit fields of one int64."""
    c1 = thr | (tl.full((), 1, tl.uint32) << s)
    c2 = thr | (tl.full((), 2, tl.uint32) << s)
    c3 = thr | (tl.full((), 3, tl.uint32) << s)
    return tl.sum((key >= c1).to(tl.int64) + ((key >= c2).to(tl.int64) << 21) + ((key >= c3).to(tl.int64) << 42),
                  axis=0)


@triton.jit
def _place(key, o, n, thr, need, written, eq_seen, vr, ir, MORE: tl.constexpr):
    """Writes one piece's keys > thr and its keys == thr still needed (index order) after `written`
    outputs and `eq_seen` keys == thr in the pieces before; returns both, updated when MORE pieces
    may follow (else unchanged: a block-wide sum saved)."""
    valid = o < n
    gt = (key > thr) & valid
    eq = (key == thr) & valid
    both = gt.to(tl.int32) + (eq.to(tl.int32) << 16)  # a piece <= 8192 < 2**16: two 16-bit fields
    cs = tl.cumsum(both, axis=0)
    n_gt = cs & 0xFFFF
    n_eq = (cs >> 16) + eq_seen
    sel = gt | (eq & (n_eq <= need))
    slot = written + n_gt + tl.minimum(n_eq, need) - tl.minimum(eq_seen, need) - 1
    tl.store(vr + slot, _value(key), mask=sel)
    tl.store(ir + slot, o.to(tl.int64), mask=sel)
    if MORE:
        tot = tl.sum(both, axis=0)
        written += (tot & 0xFFFF) + tl.minimum((tot >> 16) + eq_seen, need) - tl.minimum(eq_seen, need)
        eq_seen += tot >> 16
    return written, eq_seen


@triton.jit(do_not_specialize=["k"])
def _topk_select_kernel(x_ptr, v_ptr, i_ptr, n, k, BLOCK: tl.constexpr, NCHUNK: tl.constexpr, TAIL: tl.constexpr,
                        ALL: tl.constexpr, PDL: tl.constexpr):
    pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    xr = x_ptr + row * n
    offs = tl.arange(0, BLOCK)
    key = _keys(xr, offs, n)  # the whole row when NCHUNK == 1 (its first BLOCK when TAIL)
    if TAIL > 0:
        toffs = BLOCK + tl.arange(0, TAIL)
        tkey = _keys(xr, toffs, n)  # the rest of the row: n - BLOCK <= TAIL keys
    thr = tl.zeros((), tl.uint32)  # the k-th largest key, two bits per step from the top
    above = tl.zeros((), tl.int64)  # count(key > the current range), finally count(key > thr)
    at = tl.zeros((), tl.int64) + n  # count(key >= thr)
    if not ALL:
        s = 30
        while s >= 0:
            if NCHUNK == 1:
                packed = _counts3(key, thr, s)
                if TAIL > 0:
                    packed += _counts3(tkey, thr, s)
            else:
                packed = tl.zeros((), tl.int64)
                for c in range(NCHUNK):
                    packed += _counts3(_keys(xr, c * BLOCK + offs, n), thr, s)
            n1 = packed & 0x1FFFFF
            n2 = (packed >> 21) & 0x1FFFFF
            n3 = packed >> 42
            d = (n1 >= k).to(tl.int32) + (n2 >= k).to(tl.int32) + (n3 >= k).to(tl.int32)
            above = tl.where(d == 0, n1, tl.where(d == 1, n2, tl.where(d == 2, n3, above)))
            at = tl.where(d == 1, n1, tl.where(d == 2, n2, tl.where(d == 3, n3, at)))
            thr = thr | (d.to(tl.uint32) << s)
            s = tl.where(at == k, -2, s - 2)  # exactly k keys >= thr: done early (typical of distinct values)
        exact = at == k  # then select key > thr - 1 (thr >= 1 here: at == n > k before any step)
        thr = tl.where(exact, thr - 1, thr)
        above = tl.where(exact, k, above)
    need = k - above.to(tl.int32)  # keys == thr to take, lowest indices first
    written = tl.zeros((), tl.int32)
    eq_seen = tl.zeros((), tl.int32)
    for c in range(NCHUNK):
        o = c * BLOCK + offs
        if NCHUNK != 1:
            key = _keys(xr, o, n)
        written, eq_seen = _place(key, o, n, thr, need, written, eq_seen, v_ptr + row * k, i_ptr + row * k,
                                  NCHUNK != 1 or TAIL > 0)
    if TAIL > 0:
        _place(tkey, toffs, n, thr, need, written, eq_seen, v_ptr + row * k, i_ptr + row * k, False)


def launch_config(n: int, k: int) -> tuple[str, int, int, int, int]:
    """(kernel, BLOCK, NCHUNK, TAIL, num_warps) for a row of n. A row a little longer than a power of
    two keeps that power as its block and the rest in a second block of at most a quarter of it (TAIL):
    one block of the next power would double the work of every search step."""
    if n <= RANK_MAX:
        return "rank", max(16, triton.next_power_of_2(n)), 1, 0, 1
    low = min(triton.next_power_of_2(n) // (1 if triton.next_power_of_2(n) == n else 2), BLOCK_MAX)
    tail = max(16, triton.next_power_of_2(n - low)) if n > low else 0
    if tail and tail * TAIL_MAX_FRACTION > low:
        low, tail = min(triton.next_power_of_2(n), BLOCK_MAX), 0
    return "select", low, 1 if tail else triton.cdiv(n, low), tail, max(1, min(16, low // 512))


def topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [R, n] fp32 -> (values [R, k] fp32, indices [R, k] int64), ascending index order, on the
    current stream; ties at the k-th value to the lowest indices."""
    if x.dim() != 2 or x.dtype != torch.float32:
        raise ValueError(f"topk: x {x.dtype} {tuple(x.shape)}")
    R, n = x.shape
    if not 1 <= k <= n or n > MAX_N:
        raise ValueError(f"topk: k={k} of n={n} (1 <= k <= n <= {MAX_N})")
    x = x.contiguous()
    values = x.new_empty((R, k))
    indices = x.new_empty((R, k), dtype=torch.int64)
    if R == 0:
        return values, indices
    kind, block, nchunk, tail, warps = launch_config(n, k)
    with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext():
        if kind == "rank":
            _topk_rank_kernel[(R,)](x, values, indices, n, k, BLOCK=block, num_warps=warps, **launch_args(x))
        else:
            _topk_select_kernel[(R,)](x, values, indices, n, k, BLOCK=block, NCHUNK=nchunk, TAIL=tail, ALL=k == n,
                                 num_warps=warps, **launch_args(x))
    return values, indices
