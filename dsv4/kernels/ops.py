"""The decode kernels as torch custom ops, so torch.compile and inductor treat each as one opaque op.

docs/kernels.md: "under torch.compile, wrap kernels as custom ops with a fake implementation". Each op
takes 2-D inputs and returns a fresh fp32 [rows, N]; its real implementation runs the kernel when
the tensors allow it (CUDA, alignment, the CuTe DSL or Triton importable, the shape compiles) and
the pure-torch twin otherwise, so the op is correct on any device and the choice made inside it
never changes the result beyond fp32 summation order. The fake implementations give inductor the
output shape without running anything.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor
from torch.library import custom_op

from dsv4.ops import gemv as twins
from dsv4.ops.gate import topk_index_order

__all__ = ["triton_gemm", "settings", "rounds_in_kernel", "expert_rounds_in_kernel", "fp8_gemv", "fp4_grouped_gemv", "nvfp4_grouped_gemv", "bf16_gemv", "hc_mix_sums", "sparse_attention", "sinkhorn",
           "topk", "moe_gate", "attention_entry", "index_query"]

_TRITON: list[bool] = []


def _rows_out(x: Tensor, n: int) -> Tensor:
    return x.new_empty((x.shape[0], n), dtype=torch.float32)


@custom_op("dsv4::fp8_gemv", mutates_args=())
def fp8_gemv(x: Tensor, weight: Tensor, scale: Tensor, groups: int = 1, quant: bool = False) -> Tensor:
    """x [M, K] bf16 @ dequant(weight [N, K] e4m3, scale UE8M0 128x128)^T -> fp32 [M, N]; with
    groups G, x is [M*G, K] and output rows of group g read x row m*G + g (wo_a, one launch).
    quant: x is the unrounded activation, rounded first as fp8_fake_quant(x, 128) (the Triton
    kernel does it in its prologue; `rounds_in_kernel` says when that path runs)."""
    if x.is_cuda and triton_gemm(x.shape[0] // groups):
        from dsv4.kernels import _triton_fp8

        y = _tiled(_triton_fp8.fp8_gemm, x, weight, scale, groups, quant=quant)
        if y is not None:
            return y
    inner = quant and x.is_cuda and cute_rounds()  # the CuTe GEMV rounds x in registers
    xq = x if inner else _round(x, quant)
    if x.is_cuda:
        from dsv4.kernels import launch

        y = launch.try_dense(xq, weight, scale, groups, quant=inner)
        if y is not None:
            return y
    return twins.fp8_gemv_ref(_round(x, True) if inner else xq, weight, scale, groups)


@fp8_gemv.register_fake
def _(x, weight, scale, groups=1, quant=False):
    return x.new_empty((x.shape[0] // groups, weight.shape[0]), dtype=torch.float32)


@custom_op("dsv4::fp4_grouped_gemv", mutates_args=())
def fp4_grouped_gemv(x: Tensor, weight: Tensor, scale: Tensor, idx: Tensor, quant: bool = False) -> Tensor:
    """Row r of x [R, K] bf16 through expert idx[r] of the FP4 bank weight [E, N, K/2] -> fp32 [R, N].
    quant: x is the unrounded activation, rounded first as fp8_fake_quant(x, 128) (the Triton kernel
    does it in its grouping launch; `expert_rounds_in_kernel`)."""
    if x.is_cuda and triton_gemm(x.shape[0], "experts"):
        from dsv4.kernels import _triton_experts

        y = _tiled(_triton_experts.grouped_expert_gemm, "fp4", x, weight, scale, idx, quant=quant)
        if y is not None:
            return y
    inner = quant and x.is_cuda and cute_rounds()
    xq = x if inner else _round(x, quant)
    if x.is_cuda:
        from dsv4.kernels import launch

        y = launch.try_expert("fp4", xq, {"weight": weight, "scale": scale}, idx, quant=inner)
        if y is not None:
            return y
    return twins.fp4_grouped_gemv_ref(_round(x, True) if inner else xq, weight, scale, idx)


@fp4_grouped_gemv.register_fake
def _(x, weight, scale, idx, quant=False):
    return _rows_out(x, weight.shape[1])


@custom_op("dsv4::nvfp4_grouped_gemv", mutates_args=())
def nvfp4_grouped_gemv(x: Tensor, weight: Tensor, scale: Tensor, global_scale: Tensor, idx: Tensor) -> Tensor:
    """As fp4_grouped_gemv for an NVFP4 bank (e4m3 scale per 16, fp32 global scale per expert)."""
    if x.is_cuda and triton_gemm(x.shape[0], "experts"):
        from dsv4.kernels import _triton_experts

        y = _tiled(_triton_experts.grouped_expert_gemm, "nvfp4", x, weight, scale, idx, global_scale=global_scale)
        if y is not None:
            return y
    if x.is_cuda:
        from dsv4.kernels import launch

        bank = {"weight": weight, "scale": scale, "global_scale": global_scale}
        y = launch.try_expert("nvfp4", x, bank, idx)
        if y is not None:
            return y
    return twins.nvfp4_grouped_gemv_ref(x, weight, scale, global_scale, idx)


@nvfp4_grouped_gemv.register_fake
def _(x, weight, scale, global_scale, idx):
    return _rows_out(x, weight.shape[1])


@custom_op("dsv4::bf16_gemv", mutates_args=())
def bf16_gemv(x: Tensor, weight: Tensor) -> Tensor:
    """x [M, K] fp32 @ weight [N, K] bf16 ^T in fp32 (the released head and compressor numerics)."""
    if x.is_cuda and _triton():
        from dsv4.kernels import _triton_gemv

        return _triton_gemv.bf16_gemv(x, weight)
    return twins.bf16_gemv_ref(x, weight)


@bf16_gemv.register_fake
def _(x, weight):
    return _rows_out(x, weight.shape[0])


@custom_op("dsv4::sinkhorn", mutates_args=())
def sinkhorn(logits: Tensor, iters: int, eps: float) -> Tensor:
    """mHC comb logits [T, hc, hc] fp32 -> the Sinkhorn-normalized comb, one kernel for all iterations."""
    if logits.is_cuda and _triton():
        from dsv4.kernels import _triton_sinkhorn

        return _triton_sinkhorn.sinkhorn(logits, iters, eps)
    from dsv4.ops.sinkhorn import sinkhorn_ref

    return sinkhorn_ref(logits, iters, eps)


@sinkhorn.register_fake
def _(logits, iters, eps):
    return torch.empty_like(logits, memory_format=torch.contiguous_format)


@custom_op("dsv4::hc_comb", mutates_args=())
def hc_comb(sums: Tensor, scale: Tensor, base: Tensor, K: int, norm_eps: float, hc: int, iters: int,
            eps: float) -> Tensor:
    """The mHC comb straight from the mixes kernel's sums [T, J + 1] (RMS scale, scale[2], base, Sinkhorn):
    one Triton launch on CUDA (dsv4/ops/sinkhorn.comb_from_sums_ref)."""
    if sums.is_cuda and _triton():
        from dsv4.kernels import _triton_sinkhorn

        return _triton_sinkhorn.comb(sums, scale, base, K, norm_eps, hc, iters, eps)
    from dsv4.ops.sinkhorn import comb_from_sums_ref

    return comb_from_sums_ref(sums, scale, base, K, norm_eps, hc, iters, eps)


@hc_comb.register_fake
def _(sums, scale, base, K, norm_eps, hc, iters, eps):
    return sums.new_empty(sums.shape[0], hc, hc)


@custom_op("dsv4::compress_entry", mutates_args=("out",))
def compress_entry(pooled: Tensor, weight: Tensor, cos: Tensor, sin: Tensor, pos: Tensor, out: Tensor, ratio: int,
                   eps: float, rounding: str) -> None:
    """A compressor's pooled entry finished (model dtype, RMSNorm, RoPE, the "kv" / "index" / "none"
    rounding) and written into its cache slot when the block completes (dsv4/ops/compress.compress_entry_ref);
    one Triton launch on CUDA."""
    if out.is_cuda and _triton():
        from dsv4.kernels import _triton_entry

        if _triton_entry.applies(pooled, out, 2 * cos.numel(), rounding):
            return _triton_entry.compress_entry(pooled, weight, cos, sin, pos, out, ratio, eps, rounding)
    from dsv4.ops.compress import compress_entry_ref

    compress_entry_ref(pooled, weight, cos, sin, pos, out, ratio, eps, rounding)


@custom_op("dsv4::compress_token", mutates_args=("both", "out"))
def compress_token(kv_new: Tensor, z_new: Tensor, both: Tensor, pos: Tensor, out: Tensor, weight: Tensor, cos: Tensor,
                   sin: Tensor, ratio: int, overlap: bool, eps: float, rounding: str, ape: Tensor | None = None) -> None:
    """A compressor's whole decode step (the token's slot, its gate logits plus ape[pos % ratio] when given; at a
    block's end the pooling, the shift, the entry's finish and cache write: dsv4/ops/compress.compress_token_ref);
    one Triton launch on CUDA."""
    if both.is_cuda and _triton():
        from dsv4.kernels import _triton_token

        if _triton_token.applies(both, out, ratio, overlap, 2 * cos.numel(), rounding):
            return _triton_token.compress_token(kv_new, z_new, both, pos, out, weight, cos, sin, ratio, overlap, eps,
                                                rounding, ape)
    from dsv4.ops.compress import compress_token_ref

    compress_token_ref(kv_new, z_new, both, pos, out, weight, cos, sin, ratio, overlap, eps, rounding, ape)


@custom_op("dsv4::attention_entry", mutates_args=("window",))
def attention_entry(q: Tensor, kv: Tensor, weight: Tensor, cos: Tensor, sin: Tensor, pos: Tensor, window: Tensor,
                    q_eps: float, kv_eps: float, rounding: str) -> Tensor:
    """The attention's q [B, H * D] finished (per-head RMS, RoPE) -> [B, H, D], and its key kv [B, D] finished
    (norm, RoPE, rounding) into window[:, pos % W] (dsv4/ops/attention.attention_entry_ref); one Triton
    launch on CUDA."""
    if q.is_cuda and _triton():
        from dsv4.kernels import _triton_qkv

        if _triton_qkv.applies(q, kv, window, 2 * cos.numel(), rounding):
            return _triton_qkv.attention_entry(q, kv, weight, cos, sin, pos, window, q_eps, kv_eps, rounding)
    from dsv4.ops.attention import attention_entry_ref

    return attention_entry_ref(q, kv, weight, cos, sin, pos, window, q_eps, kv_eps, rounding)


@attention_entry.register_fake
def _(q, kv, weight, cos, sin, pos, window, q_eps, kv_eps, rounding):
    return q.new_empty(q.shape[0], q.shape[1] // kv.shape[1], kv.shape[1], dtype=window.dtype)


@custom_op("dsv4::index_query", mutates_args=())
def index_query(q: Tensor, cos: Tensor, sin: Tensor, head_dim: int, dtype: torch.dtype) -> Tensor:
    """The indexer's queries from the projection's output q [B, H * hd] -> [B, H, hd] in dtype, RoPE'd and
    rounded (dsv4/ops/attention.index_query_ref); one Triton launch on CUDA."""
    if q.is_cuda and _triton() and dtype == torch.bfloat16:
        from dsv4.kernels import _triton_qkv

        if _triton_qkv.index_query_applies(q, head_dim, 2 * cos.numel()):
            return _triton_qkv.index_query(q, cos, sin, head_dim, dtype)
    from dsv4.ops.attention import index_query_ref

    return index_query_ref(q, cos, sin, head_dim, dtype)


@index_query.register_fake
def _(q, cos, sin, head_dim, dtype):
    return q.new_empty(q.shape[0], q.shape[1] // head_dim, head_dim, dtype=dtype)


@custom_op("dsv4::hc_mix_sums", mutates_args=())
def hc_mix_sums(x: Tensor, fn: Tensor) -> Tensor:
    """mHC mixes before the RMS scale: x [T, K] (the flattened streams) -> fp32 [T, J + 1] holding
    x @ fn^T (fn [J, K]) and, in column J, sum(x^2): one Triton launch on CUDA."""
    if x.is_cuda and _triton():
        from dsv4.kernels import _triton_mixes

        return _triton_mixes.mix_sums(x, fn)
    xf = x.float()
    return torch.cat((xf @ fn.float().t(), xf.square().sum(-1, keepdim=True)), dim=-1)


@hc_mix_sums.register_fake
def _(x, fn):
    return _rows_out(x, fn.shape[0] + 1)


@custom_op("dsv4::sparse_attention", mutates_args=())
def sparse_attention(q: Tensor, keys: Tensor, mask: Tensor, sink: Tensor, scale: float, cos: Tensor | None = None,
                     sin: Tensor | None = None, comp: Tensor | None = None, sel: Tensor | None = None) -> Tensor:
    """Decode attention with a sink, bf16: q [B, H, D], keys [B, N, D] (K = V), mask [B, N] bool, sink [H]
    -> o [B, H, D] bf16 with bf16-rounded probabilities. With comp, keys is the window and the keys are
    its rows then comp's entries (all, or those sel [B, K] picks); with cos, sin [RD / 2] (one query
    position) o's last RD features rotated back by the inverse RoPE. Three short Triton launches on CUDA
    (keys split across programs)."""
    if q.is_cuda and _triton():
        from dsv4.kernels import _triton_attention

        return _triton_attention.sparse_attention(q, keys, mask, sink, scale, cos, sin, comp, sel)
    from dsv4.layers.rope import apply_rope
    from dsv4.ops.attention import sparse_attention_ref, window_then_entries

    flat = window_then_entries(keys, comp, sel)
    o = sparse_attention_ref(q[:, None], flat, mask[:, None], sink, scale, torch.bfloat16)[:, 0]
    return o if cos is None else apply_rope(o, cos, sin, inverse=True)


@sparse_attention.register_fake
def _(q, keys, mask, sink, scale, cos=None, sin=None, comp=None, sel=None):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


TOPK_MAX_N = (1 << 21) - 1  # _triton_topk.MAX_N (its counts are packed into 21-bit fields)


@custom_op("dsv4::topk", mutates_args=())
def topk(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The k largest of each row of x [R, n] fp32 -> (values [R, k] fp32, indices [R, k] int64) in
    ascending index order, ties at the k-th value to the lowest indices (one Triton launch on CUDA)."""
    if x.is_cuda and _triton() and x.shape[-1] <= TOPK_MAX_N:
        from dsv4.kernels import _triton_topk

        return _triton_topk.topk(x, k)
    return topk_index_order(x, k)


@topk.register_fake
def _(x, k):
    return x.new_empty((x.shape[0], k), dtype=torch.float32), x.new_empty((x.shape[0], k), dtype=torch.int64)


@custom_op("dsv4::moe_gate", mutates_args=())
def moe_gate(logits: Tensor, bias: Tensor, k: int, route_scale: float) -> tuple[Tensor, Tensor]:
    """A learned MoE gate's routing from its fp32 logits [N, E] -> (weights [N, k] fp32, indices [N, k] int64),
    picks in index order (dsv4/ops/gate.moe_gate_ref); one Triton launch on CUDA."""
    if logits.is_cuda and _triton():
        from dsv4.kernels import _triton_gate

        if _triton_gate.applies(logits, bias, k):
            return _triton_gate.moe_gate(logits, bias, k, route_scale)
    from dsv4.ops.gate import moe_gate_ref

    return moe_gate_ref(logits, bias, k, route_scale)


@moe_gate.register_fake
def _(logits, bias, k, route_scale):
    return logits.new_empty((logits.shape[0], k)), logits.new_empty((logits.shape[0], k), dtype=torch.int64)


# rows from which the Triton tensor-core GEMMs replace the CuTe GEMVs, per kind (H200, flash shapes,
# dsv4/kernels/NOTES.md session 6): FP8 from 3 rows (batch 16: 3.7 ms per step against 12.0; at one
# row the CuTe GEMV is faster, 2.2 against 3.5 ms); the grouped experts from 96 rows (batch 16 with
# 6 experts per token: 15.6 against 19.0 ms; at 6 and 24 rows the CuTe kernel is 2-3x faster)
TRITON_MIN_ROWS = {"fp8": 3, "experts": 96}
_OFF = ("0", "false", "no", "off")


def triton_gemm(rows: int, kind: str = "fp8") -> bool:
    """Whether the Triton tensor-core GEMM of `kind` ("fp8" dense, "experts" grouped FP4/NVFP4; each
    weight tile read once for all rows) runs for `rows` input rows, else the CuTe GEMV (one pass per
    row). DSV4_TRITON_GEMM=0 turns both off; DSV4_TRITON_FP8_ROWS / DSV4_TRITON_EXPERTS_ROWS move a
    threshold (1 = always)."""
    if os.environ.get("DSV4_TRITON_GEMM", "").strip().lower() in _OFF or not _triton():
        return False
    env = os.environ.get(f"DSV4_TRITON_{kind.upper()}_ROWS", "").strip()
    return rows >= (int(env) if env.isdigit() else TRITON_MIN_ROWS[kind])


def settings() -> str:
    """The kernel switches set in the environment, for a bench row's note ("" when all are at their defaults)."""
    names = ("DSV4_TRITON_GEMM", "DSV4_TRITON_FP8_ROWS", "DSV4_TRITON_EXPERTS_ROWS", "DSV4_TRITON_MIXES",
             "DSV4_TRITON_ATTN", "DSV4_TRITON_ATTN_ROPE", "DSV4_TRITON_ATTN_KEYS",
             "DSV4_TRITON_ENTRY", "DSV4_TRITON_TOKEN", "DSV4_TRITON_COMB", "DSV4_TRITON_QKV", "DSV4_TRITON_GATE",
             "DSV4_TRITON_INDEXQ", "DSV4_TRITON_TUNE", "DSV4_PDL", "DSV4_PREFETCH", "DSV4_CUTE_ROUND", "DSV4_CUTE_MMA",
             "DSV4_CUTE_MMA_SLOTS", "DSV4_ASIDE")
    return ", ".join(f"{n}={os.environ[n]}" for n in names if os.environ.get(n, "").strip())


def _round(x: Tensor, quant: bool) -> Tensor:
    """x rounded as the released activation rounding (quant), else x."""
    if not quant:
        return x
    from dsv4.ops.quantize import fp8_fake_quant

    return fp8_fake_quant(x, 128)


def cute_rounds() -> bool:
    """Whether the CuTe GEMVs round the activation themselves (the DSL importable; DSV4_CUTE_ROUND=0
    turns it off: two rounding kernels in front of each GEMV instead, for an A/B; =registers makes every
    warp round in registers instead of the CTA once in shared memory)."""
    if os.environ.get("DSV4_CUTE_ROUND", "").strip().lower() in _OFF:
        return False
    from dsv4.kernels import launch

    return launch._available()


def rounds_in_kernel(x: Tensor, groups: int = 1) -> bool:
    """True where fp8_gemv(x, ..., quant=True) rounds the activation inside the GEMM kernel (one
    launch, no rounding kernel in front): the Triton GEMM's prologue, or the CuTe GEMV's registers;
    elsewhere the op rounds with torch ops first."""
    return x.is_cuda and x.shape[-1] % 128 == 0 and (triton_gemm(x.shape[0] // groups) or cute_rounds())


def expert_rounds_in_kernel(x: Tensor) -> bool:
    """True where fp4_grouped_gemv(x, ..., quant=True) rounds the activation inside its kernels."""
    return x.is_cuda and x.shape[-1] % 128 == 0 and (triton_gemm(x.shape[0], "experts") or cute_rounds())


def _tiled(kernel, *args, **kwargs) -> Tensor | None:
    """A Triton batched GEMM's result, or None for a shape it does not tile (its ValueError): the
    caller goes on to the CuTe kernel or the twin."""
    try:
        return kernel(*args, **kwargs)
    except ValueError:
        return None


def _triton() -> bool:
    if not _TRITON:
        try:
            import triton  # noqa: F401

            _TRITON.append(True)
        except Exception:  # not installed (CPU wheels) or broken
            _TRITON.append(False)
    return _TRITON[0]
