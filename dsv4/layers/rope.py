"""Interleaved rotary embedding on the last `rope_head_dim` features, with YaRN for compressed layers.

Pairs are (x[2i], x[2i+1]). Ratio-0 layers use rope_theta and no YaRN; layers with a compressor use
compress_rope_theta with the YaRN frequency ramp for everything in the layer. No mscale: the
softmax scale stays 1/sqrt(head_dim). Angles are computed from positions on the fly (fp32), so a
position can be a Python int (reference path) or a device tensor (graph-ready path).
"""

from __future__ import annotations

import math

import torch

from dsv4.config import ModelConfig


def yarn_correction_range(rot_dim: int, theta: float, beta_fast: float, beta_slow: float,
                          original_seq_len: int) -> tuple[int, int]:
    """Dims whose wavelength falls between the beta_fast and beta_slow rotation counts."""

    def dim_for(rotations: float) -> float:
        return rot_dim * math.log(original_seq_len / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low = math.floor(dim_for(beta_fast))
    high = math.ceil(dim_for(beta_slow))
    return max(low, 0), min(high, rot_dim - 1)


def rope_frequencies(cfg: ModelConfig, ratio: int, device=None) -> torch.Tensor:
    """fp32 [rope_head_dim // 2] angular frequencies for a layer of this compress ratio."""
    rd = cfg.rope_head_dim
    theta = cfg.compress_rope_theta if ratio else cfg.rope_theta
    freqs = 1.0 / (theta ** (torch.arange(0, rd, 2, dtype=torch.float32, device=device) / rd))
    if ratio:
        low, high = yarn_correction_range(rd, theta, cfg.beta_fast, cfg.beta_slow, cfg.original_seq_len)
        ramp = ((torch.arange(rd // 2, dtype=torch.float32, device=device) - low) / max(high - low, 1e-3)).clamp(0, 1)
        freqs = freqs * (1 - ramp) + freqs / cfg.rope_factor * ramp
    return freqs


def rope_angles(pos, freqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of pos * freqs; pos is an int or an integer tensor of any shape -> [..., rd/2]."""
    if isinstance(pos, int):
        pos = torch.tensor(pos, device=freqs.device)
    ang = pos.to(torch.float32).unsqueeze(-1) * freqs
    return torch.cos(ang), torch.sin(ang)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """Rotates the last 2*cos.shape[-1] features of x; cos/sin broadcast over x's leading dims."""
    rd = 2 * cos.shape[-1]
    pe = x[..., -rd:].float().unflatten(-1, (-1, 2))
    a, b = pe[..., 0], pe[..., 1]
    if inverse:
        sin = -sin
    rot = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
    return torch.cat((x[..., :-rd], rot.to(x.dtype)), dim=-1)
