"""A compressor's decode step in pure torch: the twin of the fused kernel, and the reference.

The gated pooling of dsv4/layers/compressor.py seen from its state: the token's kv and gate logits go
into their slot of the block state, the block's rows are pooled (softmax of the gate logits over the
rows, per channel, times kv), and when the token completes an overlapping (ratio-4) block, the
block becomes the previous one; where the token completes its block the entry is finished and written
to the cache. dsv4/kernels/_triton_token.py does the whole step in one launch (_triton_entry.py the
finish and write alone).
"""

from __future__ import annotations

import torch


def pool_rows(kv: torch.Tensor, z: torch.Tensor, ratio: int, overlap: bool) -> torch.Tensor:
    """[..., rows, c*hd] block state -> [..., hd] fp32 pooled entries. Ratio 4 (overlap): rows [0, m)
    are the previous block through channels [0, hd), rows [m, 2m) this block through [hd, 2hd)."""
    if overlap:
        hd = kv.shape[-1] // 2
        kv = torch.cat((kv[..., :ratio, :hd], kv[..., ratio:, hd:]), dim=-2)
        z = torch.cat((z[..., :ratio, :hd], z[..., ratio:, hd:]), dim=-2)
    return (z.softmax(dim=-2) * kv).sum(dim=-2)


def compress_step_both(kv_new: torch.Tensor, z_new: torch.Tensor, both: torch.Tensor, pos: torch.Tensor, ratio: int,
                       overlap: bool) -> torch.Tensor:
    """kv_new, z_new [B, c*hd] fp32 (z with its ape) into the state buffer that holds kv and the gate logits
    side by side ([B, slots, 2, c*hd] fp32, dsv4/cache.py, written in place), pos a 0-dim int64 device
    tensor -> the block's pooled entry [B, hd] fp32, as it stands after this token. One slot write and one
    block shift (under inductor every mutated buffer is a kernel of its own)."""
    slot = (pos % ratio + (ratio if overlap else 0)).view(1)
    both.index_copy_(1, slot, torch.stack((kv_new, z_new), dim=1).unsqueeze(1).to(both.dtype))
    pooled = pool_rows(both[:, :, 0], both[:, :, 1], ratio, overlap)
    if overlap:
        done = ((pos + 1) % ratio) == 0
        both[:, :ratio] = torch.where(done, both[:, ratio:], both[:, :ratio])
    return pooled


def compress_entry_ref(pooled: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                       pos: torch.Tensor, out: torch.Tensor, ratio: int, eps: float, rounding: str) -> None:
    """Compressor.finish of the pooled entry [B, hd] fp32 (model dtype = out's, RMSNorm with `weight`, RoPE
    with the block position's cos, sin [rd / 2], the rounding "kv", "index" or "none") written into
    out[:, pos // ratio] where the token completes its block (the old row stays otherwise): the twin of
    the one-launch kernel."""
    from dsv4.cache import write_slot
    from dsv4.layers.norm import rms
    from dsv4.layers.rope import apply_rope
    from dsv4.ops.kvquant import round_index, round_kv

    entry = (rms(pooled.to(out.dtype), eps) * weight.float()).to(out.dtype)
    entry = apply_rope(entry, cos, sin)
    if rounding == "kv":
        entry = round_kv(entry, 2 * cos.numel())
    elif rounding == "index":
        entry = round_index(entry)
    write_slot(out, (pos // ratio).view(1), entry, keep=((pos + 1) % ratio) != 0)


def compress_token_ref(kv_new: torch.Tensor, z_new: torch.Tensor, both: torch.Tensor, pos: torch.Tensor,
                       out: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ratio: int,
                       overlap: bool, eps: float, rounding: str, ape: torch.Tensor | None = None) -> None:
    """A compressor's whole decode step on its one state buffer: the token into its slot (z_new plus ape's row
    pos % ratio when given: Compressor.project's absolute-position term), the pooling and
    the shift (compress_step_both), the entry finished and written where the block completes
    (compress_entry_ref): the twin of the one-launch kernel (dsv4/kernels/_triton_token.py)."""
    if ape is not None:
        z_new = z_new + ape[(pos % ratio).view(1)][0]
    pooled = compress_step_both(kv_new, z_new, both, pos, ratio, overlap)
    compress_entry_ref(pooled, weight, cos, sin, pos, out, ratio, eps, rounding)
