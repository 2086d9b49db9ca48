"""The simulated rounding the released model applies inside attention (bfloat16 mode only).

Window and compressed KV keep their RoPE dims exact and round the rest to FP8 (UE8M0 per 64).
Indexer queries and keys are Walsh-Hadamard rotated, then rounded to FP4 (UE8M0 per 32); in
float32 mode the rotation is skipped too, since it cancels in q.k without the rounding.
"""

from __future__ import annotations

import torch

from dsv4.ops.quantize import fp4_fake_quant, fp8_fake_quant, hadamard


def round_kv(x: torch.Tensor, rope_dim: int) -> torch.Tensor:
    nope = x.shape[-1] - rope_dim
    return torch.cat((fp8_fake_quant(x[..., :nope], 64), x[..., nope:]), dim=-1)


def round_index(x: torch.Tensor) -> torch.Tensor:
    return fp4_fake_quant(hadamard(x), 32)
