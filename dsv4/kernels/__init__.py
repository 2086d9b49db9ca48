"""Weight-only decode kernels (CuTe DSL FP8/FP4/NVFP4, Triton bf16), behind a switch that defaults to OFF.

`enabled()` is true when `use(True)` was called or the environment has DSV4_KERNELS=1. The
model's integration points (Linear.forward for FP8 and bf16 weights, the grouped wo_a, the LM
head, the MoE gate and its top-k, the indexer's top-k, StaticMoE.expert_linear for FP4 and NVFP4
expert banks) ask `dense_gemv`, `bf16_dense_gemv`, `expert_gemv` and `topk`, which return None
when the kernels do not apply (switch off, CPU tensors, float32 activations for the FP8 path,
prefill-sized inputs): the caller then runs its pure-torch twin, so CPU behaviour never changes.
When they apply they call the custom ops in `ops.py`, which torch.compile sees as single opaque
ops, and which themselves fall back to the twin for what only real tensors can tell (alignment, a
shape the compiler rejects, no CuTe DSL).

The layer kernels (mHC mixes, decode attention, the compressor step) run at the batch sizes at which
they measured faster than what they replace (`LAYER_KERNEL_ROWS`; DSV4_TRITON_<NAME>=1/0 overrides).
On sm_90+ every kernel is launched with programmatic dependent launch unless DSV4_PDL=0 (`_pdl.py`).

Nothing here imports cutlass or triton: they are imported only when a GPU kernel is about to
run, so the package imports and every CPU test passes without CUDA or the native libraries.
"""

from __future__ import annotations

import os

import torch

__all__ = ["enabled", "use", "available", "expert_gemv", "expert_rounds_in_kernel", "dense_gemv", "rounds_in_kernel",
           "bf16_dense_gemv", "hc_mix_sums", "hc_comb", "sparse_attention", "sinkhorn", "compress_entry",
           "compress_token", "compress_token_applies", "attention_entry", "index_query", "moe_gate", "topk", "fp4_grouped_gemv", "nvfp4_grouped_gemv", "fp8_gemv", "pdl"]

_STATE: dict[str, bool | None] = {"forced": None}
MAX_DENSE_ROWS = 64  # decode sizes; larger inputs (prefill) keep the twin's GEMM
# One program per row: on the H200 the Triton top-k (k=512) took 9 us at n=4096 and 37 us at 16384
# against torch.topk's 38 and 86, but 229 us at 65536 against 63. Longer rows keep torch.topk.
TOPK_MAX_ROW = 16384
GATE_MAX_E = 256  # the gate kernel holds a row's [E, E] comparison in registers (dsv4/kernels/_triton_gate.py)


def enabled() -> bool:
    """The switch: `use(flag)` wins over the environment variable DSV4_KERNELS (default off)."""
    if _STATE["forced"] is not None:
        return bool(_STATE["forced"])
    return os.environ.get("DSV4_KERNELS", "0").strip().lower() in ("1", "true", "yes", "on")


def pdl() -> bool:
    """Programmatic dependent launch for our Triton kernels and inductor's (sm_90+, dsv4/kernels/_pdl.py):
    on unless DSV4_PDL is 0/false/no/off."""
    return os.environ.get("DSV4_PDL", "1").strip().lower() not in ("0", "false", "no", "off")


def use(flag: bool | None) -> bool | None:
    """Turn the kernels on or off for this process; None goes back to the environment variable.
    Returns the previous setting, so a caller can put it back."""
    before = _STATE["forced"]
    _STATE["forced"] = None if flag is None else bool(flag)
    return before


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


# Layer kernels, on for the rows of a step at which the H200 measured them faster than what they
# replace (dsv4/kernels/NOTES.md, sessions 7 and 9): (least, most) rows, None = unbounded; a name
# missing here is off unless asked for. The attention kernels (keys split across programs, three
# launches) take ~10 us per layer at batch 1 (session 11), against ~24 us and nine launches for the
# cuBLAS batched matmuls and softmax kernels they replace: on at every batch (the one-program-per-head-
# tile version took 30 us, on from 16 rows only). The mixes kernel took 5.8 us per site
# at batch 1, where the path it replaces is five launches (a split RMS reduction, the normalized copy,
# cuBLAS's dot and reduce: 8.4 us of kernels plus their gaps), and 19 us at batch 16 (~14 us).
# The inverse RoPE in the attention's last launch (ATTN_ROPE) and a compressor's entry in one launch
# (ENTRY) each took 1.3% off a four-layer batch-1 step (session 12, one process per setting); reading
# the keys in place (ATTN_KEYS) was 0.5% slower there and stays off. The comb straight from the mixes
# kernel's sums (COMB) takes 2 launches off each layer (86 of a flash step); its full-depth row, taken
# with ENTRY off, put it at about -0.06 ms (session 12). The compressor's whole step in one launch (TOKEN)
# passed its GPU tests and measured faster (session 13): on. The attention entry (QKV), the indexer's
# decode queries (INDEXQ) and the learned gate (GATE) each replace two to six inductor kernels with one
# launch: with the ape folded into the whole-step kernel they took a flash batch-1 step from 2,098 to 1,588
# kernels and 7.54 to 6.90 ms (session 16).
LAYER_KERNEL_ROWS: dict[str, tuple[int | None, int | None]] = {
    "MIXES": (None, 8), "ATTN": (None, None), "ATTN_ROPE": (None, None), "ENTRY": (None, None),
    "COMB": (None, 8), "TOKEN": (None, None), "QKV": (None, None),
    "GATE": (None, None), "INDEXQ": (None, None)}


def _off(name: str, rows: int) -> bool:
    """Whether one Triton layer kernel is left out for a step of `rows` rows: DSV4_TRITON_<name>=1 / 0
    turns it on / off everywhere, unset takes LAYER_KERNEL_ROWS (A/B switch recorded by the bench)."""
    v = os.environ.get(f"DSV4_TRITON_{name}", "").strip().lower()
    if not v:
        if name not in LAYER_KERNEL_ROWS:
            return True
        least, most = LAYER_KERNEL_ROWS[name]
        return (least is not None and rows < least) or (most is not None and rows > most)
    return v in ("0", "false", "no", "off")


def _applies(x: torch.Tensor) -> bool:
    return enabled() and x.is_cuda


def expert_gemv(fmt: str, x: torch.Tensor, bank: dict, idx: torch.Tensor, quant: bool = False) -> torch.Tensor | None:
    """The routed-expert kernel for StaticMoE, or None when the caller should use its twin.
    quant (fp4 only): x is unrounded and the op applies the FP8 activation rounding
    (see `expert_rounds_in_kernel`)."""
    if (not _applies(x) or fmt not in ("fp4", "nvfp4") or x.dtype != torch.bfloat16 or x.dim() != 2
            or (quant and fmt != "fp4")):
        return None
    from dsv4.kernels import ops

    if fmt == "fp4":
        return ops.fp4_grouped_gemv(x, bank["weight"], bank["scale"], idx, quant)
    return ops.nvfp4_grouped_gemv(x, bank["weight"], bank["scale"], bank["global_scale"], idx)


def dense_gemv(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, groups: int = 1,
               quant: bool = False) -> torch.Tensor | None:
    """The FP8 dense kernel for Linear.forward (any leading dims, fp32 out), or None to use the twin.

    groups G > 1 (wo_a): x [..., G, K] and weight [G * R, K]; group g through rows g*R.. -> [..., G*R].
    quant: x is unrounded and the op applies the FP8 activation rounding (see `rounds_in_kernel`)."""
    K = weight.shape[-1]
    if not _applies(x) or x.dtype != torch.bfloat16 or weight.dtype != torch.float8_e4m3fn or x.shape[-1] != K:
        return None
    lead = x.shape[:-2] if groups > 1 else x.shape[:-1]
    if groups > 1 and x.shape[-2] != groups:
        return None
    x2 = x.reshape(-1, K)
    if x2.shape[0] > MAX_DENSE_ROWS * groups:  # prefill-sized inputs: the twin's matmul
        return None
    from dsv4.kernels import ops

    return ops.fp8_gemv(x2, weight, scale, groups, quant).view(*lead, weight.shape[0])


def rounds_in_kernel(x: torch.Tensor) -> bool:
    """Whether dense_gemv(x, ..., quant=True) folds the FP8 activation rounding into the GEMM kernel,
    so a caller should hand it x unrounded (anywhere else it rounds first, with torch ops)."""
    if not _applies(x) or x.dim() < 1:
        return False
    from dsv4.kernels import ops

    return ops.rounds_in_kernel(x.reshape(-1, x.shape[-1]))


def expert_rounds_in_kernel(fmt: str, x: torch.Tensor) -> bool:
    """Whether expert_gemv(fmt, x, ..., quant=True) rounds the activation inside the expert kernels
    (FP4 banks on the batched Triton path), so a caller should hand it x unrounded."""
    if fmt != "fp4" or not _applies(x) or x.dim() != 2:
        return False
    from dsv4.kernels import ops

    return ops.expert_rounds_in_kernel(x)


def bf16_dense_gemv(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor | None:
    """x (any leading dims) in fp32 times a bf16 weight [N, K]^T, fp32 out; None to use the twin."""
    K = weight.shape[-1]
    if not _applies(x) or weight.dtype != torch.bfloat16 or x.shape[-1] != K:
        return None
    x2 = x.reshape(-1, K).float()
    if x2.shape[0] > MAX_DENSE_ROWS:
        return None
    from dsv4.kernels import ops

    return ops.bf16_gemv(x2, weight).view(*x.shape[:-1], weight.shape[0])


def hc_mix_sums(x: torch.Tensor, fn: torch.Tensor) -> torch.Tensor | None:
    """What mhc.hc_mixes needs in one launch: for the flattened streams x [..., K] (bf16 or fp32, fn [J, K])
    fp32 [..., J + 1] holding x @ fn^T and, last, sum(x^2); or None to use the twin. The RMS scale is
    applied by the caller (a pointwise op for the compiler to fuse). Up to 8 rows, or as
    DSV4_TRITON_MIXES=1 / 0 says (LAYER_KERNEL_ROWS)."""
    K = fn.shape[-1]
    if not _applies(x) or x.shape[-1] != K or x.dtype not in (torch.bfloat16, torch.float32):
        return None
    x2 = x.reshape(-1, K)
    if x2.shape[0] > MAX_DENSE_ROWS or _off("MIXES", x2.shape[0]):
        return None
    from dsv4.kernels import ops

    return ops.hc_mix_sums(x2, fn).view(*x.shape[:-1], fn.shape[0] + 1)


def hc_comb(sums: torch.Tensor, K: int, norm_eps: float, scale: torch.Tensor, base: torch.Tensor, hc: int,
            iters: int, eps: float) -> torch.Tensor | None:
    """mhc's comb straight from hc_mix_sums' output [..., J + 1] in one launch (RMS scale, scale[2], base and
    the Sinkhorn; the logits kernel in front of the Sinkhorn goes away) -> [..., hc, hc] fp32, or None to
    take the logits path. With the mixes kernel (up to 8 rows), or as DSV4_TRITON_COMB=1 / 0 says."""
    if not _applies(sums) or _off("COMB", sums.numel() // sums.shape[-1]):
        return None
    from dsv4.kernels import ops

    flat = sums.reshape(-1, sums.shape[-1])
    return ops.hc_comb(flat, scale, base, K, norm_eps, hc, iters, eps).view(*sums.shape[:-1], hc, hc)


def sparse_attention(q: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor | None, sink: torch.Tensor, scale: float,
                     probs_dtype: torch.dtype, unrope: tuple[torch.Tensor, torch.Tensor] | None = None,
                     comp: torch.Tensor | None = None, sel: torch.Tensor | None = None) -> torch.Tensor | None:
    """layers/attention.sparse_attention in three short launches for decode in bfloat16 mode (q [B, 1, H, D],
    keys [B, N, D], mask [B, 1, N] bool or None, bf16 probabilities), or None to use the reference.
    At every batch, or as DSV4_TRITON_ATTN=1 / 0 says (LAYER_KERNEL_ROWS).

    With `comp` the keys are the window `keys` then comp's entries (all, or those `sel` picks), which
    the kernels read where they lie where DSV4_TRITON_ATTN_KEYS=1 (else they are concatenated first).
    With `unrope` = (cos, sin) of the one query position ([RD / 2] fp32), o comes back rotated by the
    inverse RoPE: inside the last launch (LAYER_KERNEL_ROWS; DSV4_TRITON_ATTN_ROPE=0 does it by the same
    torch ops after it). Reading the keys in place measured slower on the H200: off unless asked for."""
    if (not _applies(q) or q.dim() != 4 or q.shape[1] != 1 or q.dtype != torch.bfloat16 or keys.dtype != torch.bfloat16
            or probs_dtype != torch.bfloat16 or q.shape[-1] & (q.shape[-1] - 1)
            or _off("ATTN", q.shape[0])):
        return None
    from dsv4.kernels import ops

    from dsv4.ops.attention import key_count, window_then_entries

    B = keys.shape[0]
    if comp is not None and _off("ATTN_KEYS", B):
        keys, comp, sel = window_then_entries(keys, comp, sel), None, None
    N = key_count(keys, comp, sel)
    m = torch.ones(B, N, dtype=torch.bool, device=q.device) if mask is None else mask.reshape(B, N)
    if unrope is not None and not _off("ATTN_ROPE", B):
        return ops.sparse_attention(q[:, 0], keys, m, sink, scale, *unrope, comp=comp, sel=sel)[:, None]
    o = ops.sparse_attention(q[:, 0], keys, m, sink, scale, comp=comp, sel=sel)[:, None]
    if unrope is None:
        return o
    from dsv4.layers.rope import apply_rope

    return apply_rope(o, unrope[0], unrope[1], inverse=True)


def sinkhorn(logits: torch.Tensor, iters: int, eps: float) -> torch.Tensor | None:
    """The one-launch Sinkhorn for mhc.sinkhorn_split ([..., hc, hc] fp32), or None to use the twin."""
    if not _applies(logits) or logits.dtype != torch.float32:
        return None
    from dsv4.kernels import ops

    hc = logits.shape[-1]
    return ops.sinkhorn(logits.reshape(-1, hc, hc), iters, eps).view(logits.shape)


def compress_entry(pooled: torch.Tensor, pos: torch.Tensor, out: torch.Tensor, ratio: int, weight: torch.Tensor,
                   eps: float, freqs: torch.Tensor, rounding: str) -> bool:
    """Compressor.finish + the cache write of the graph-ready step in one launch (dsv4/kernels/_triton_entry.py),
    for the KV and the indexer compressors: True when it ran, False to use the torch path (other shapes).
    On by LAYER_KERNEL_ROWS; DSV4_TRITON_ENTRY=0 for the torch path."""
    if not _applies(out) or _off("ENTRY", out.shape[0]):
        return False
    from dsv4.kernels import _triton_entry, ops
    from dsv4.layers.rope import rope_angles

    if not _triton_entry.applies(pooled, out, 2 * freqs.numel(), rounding):
        return False
    cos, sin = rope_angles((pos // ratio) * ratio, freqs)  # the block's position
    ops.compress_entry(pooled, weight, cos, sin, pos, out, ratio, eps, rounding)
    return True


def compress_token_applies(both: torch.Tensor, out: torch.Tensor, ratio: int, overlap: bool, freqs: torch.Tensor,
                           rounding: str) -> bool:
    """Whether `compress_token` runs the one-launch step for this compressor's state and cache."""
    if not _applies(out) or _off("TOKEN", out.shape[0]):
        return False
    from dsv4.kernels import _triton_token

    return _triton_token.applies(both, out, ratio, overlap, 2 * freqs.numel(), rounding)


def compress_token(kv_new: torch.Tensor, z_new: torch.Tensor, both: torch.Tensor, pos: torch.Tensor,
                   out: torch.Tensor, ratio: int, overlap: bool, weight: torch.Tensor, eps: float,
                   freqs: torch.Tensor, rounding: str, ape: torch.Tensor | None = None) -> bool:
    """A compressor's whole graph-ready step in one launch (dsv4/kernels/_triton_token.py: the slot write,
    and where the block completes the pooling, shift, finish and cache write): True when it ran, False
    to use the torch step and the entry kernel. With `ape` ([m, c*hd]) z_new is the projection's output and the
    kernel adds ape's row pos % m. On by LAYER_KERNEL_ROWS; DSV4_TRITON_TOKEN=0 for the others."""
    if not compress_token_applies(both, out, ratio, overlap, freqs, rounding):
        return False
    from dsv4.kernels import ops
    from dsv4.layers.rope import rope_angles

    cos, sin = rope_angles((pos // ratio) * ratio, freqs)  # the block's position
    ops.compress_token(kv_new, z_new, both, pos, out, weight, cos, sin, ratio, overlap, eps, rounding, ape)
    return True


def attention_entry(q: torch.Tensor, kv: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                    pos: torch.Tensor, window: torch.Tensor, q_eps: float, kv_eps: float, rounding: str) -> torch.Tensor:
    """ops/attention.attention_entry_ref in one launch (dsv4/kernels/_triton_qkv.py): q [B, H * D] -> [B, H, D],
    the key finished into the window slot. Call it where `attention_entry_applies` said so."""
    from dsv4.kernels import ops

    return ops.attention_entry(q, kv, weight, cos, sin, pos, window, q_eps, kv_eps, rounding)


def attention_entry_applies(x: torch.Tensor, window: torch.Tensor, rows: int) -> bool:
    """Whether decode finishes its q and window key in one launch (attention_entry): bf16 on CUDA at a
    step of `rows` rows, on by LAYER_KERNEL_ROWS; DSV4_TRITON_QKV=0 keeps the torch ops."""
    return (_applies(x) and x.dtype == torch.bfloat16 and window.dtype == torch.bfloat16
            and not _off("QKV", rows))


def index_query(q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_dim: int, dtype: torch.dtype) -> torch.Tensor:
    """ops/attention.index_query_ref in one launch (dsv4/kernels/_triton_qkv.py): the indexer's decode queries from
    the projection's fp32 output [B, H * hd] -> [B, H, hd]. Call it where `index_query_applies` said so."""
    from dsv4.kernels import ops

    return ops.index_query(q, cos, sin, head_dim, dtype)


def index_query_applies(x: torch.Tensor, rows: int) -> bool:
    """Whether the indexer's decode queries (RoPE and FP4 rounding) take one launch: bf16 on CUDA, on by
    LAYER_KERNEL_ROWS; DSV4_TRITON_INDEXQ=0 keeps the torch ops."""
    return _applies(x) and x.dtype == torch.bfloat16 and not _off("INDEXQ", rows)


def moe_gate(logits: torch.Tensor, bias: torch.Tensor, k: int, route_scale: float) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A learned gate's (weights, indices) from its fp32 logits [..., E] in one launch (dsv4/kernels/_triton_gate.py;
    picks in index order), or None to use the torch ops. On by LAYER_KERNEL_ROWS; DSV4_TRITON_GATE=0 for torch."""
    if not _applies(logits) or logits.dtype != torch.float32 or logits.dim() < 1 or logits.shape[-1] > GATE_MAX_E:
        return None  # more experts: the top-k kernel's radix select after torch's scores
    flat = logits.reshape(-1, logits.shape[-1])
    if _off("GATE", flat.shape[0]):
        return None
    from dsv4.kernels import ops

    w, idx = ops.moe_gate(flat, bias.float(), k, route_scale)
    return w.view(*logits.shape[:-1], k), idx.view(*logits.shape[:-1], k)


def topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(values, indices) of the k largest along the last dim in one Triton launch, or None to use torch.topk.

    fp32 CUDA input with any leading dims and 1 <= k <= n <= TOPK_MAX_ROW. The k come in ascending index
    order (torch.topk sorts them by value): callers use them as a set. Ties at the k-th value go to
    the lowest indices, so the result is bitwise deterministic."""
    n = x.shape[-1] if x.dim() else 0
    if not _applies(x) or x.dtype != torch.float32 or not 1 <= k <= n:
        return None
    from dsv4.kernels import ops

    if n > min(TOPK_MAX_ROW, ops.TOPK_MAX_N):
        return None
    values, indices = ops.topk(x.reshape(-1, n), k)
    return values.view(*x.shape[:-1], k), indices.view(*x.shape[:-1], k)
