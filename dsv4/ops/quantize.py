"""The released number formats, as pure-torch reference ops.

FP8 e4m3 with UE8M0 (power-of-two) scales: 128x128 weight blocks, 1xB activation blocks.
FP4 e2m1 packed two per byte (low nibble = even element) with UE8M0 1x32 scales.
NVFP4: e2m1 with an e4m3 scale per 16 elements and one fp32 global scale per tensor.

Every scale is computed on the tensor's device from device values: no quantize call reads
anything back to the host, so these ops are safe inside a captured decode step.
"""

from __future__ import annotations

import torch

__all__ = [
    "FP8_MAX", "FP4_MAX", "E2M1_VALUES",
    "ue8m0_scale", "fp8_fake_quant", "fp4_fake_quant", "hadamard",
    "quantize_fp8_blockwise", "dequantize_fp8_blockwise",
    "quantize_fp4", "dequantize_fp4", "pack_fp4", "unpack_fp4",
    "quantize_nvfp4", "dequantize_nvfp4",
    "e8m0_to_float", "float_to_e8m0",
]

FP8_MAX = 448.0
FP4_MAX = 6.0
E8M0 = torch.float8_e8m0fnu
E4M3 = torch.float8_e4m3fn
# e2m1 code -> value; codes 8..15 are the negatives of 0..7
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def ue8m0_scale(amax: torch.Tensor, qmax: float, floor: float = 1e-4) -> torch.Tensor:
    """The released scale rule: s = 2^ceil(log2(max(amax, floor) / qmax)), in fp32.

    ceil(log2(y)) is read off y's fp32 bits (exponent, +1 unless the mantissa is zero), as the
    released kernels do: `torch.log2` rounds to an integer just above a power of two and would
    then pick a scale half the released one.
    """
    y = amax.float().clamp(min=floor) / qmax  # a normal fp32 number: floor/qmax >> 2^-126
    bits = y.view(torch.int32)
    e = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    return torch.exp2(e.float())


def e8m0_to_float(scale: torch.Tensor) -> torch.Tensor:
    """UE8M0 byte b means 2^(b-127)."""
    if scale.dtype == E8M0:
        return scale.float()
    return torch.exp2(scale.view(torch.uint8).float() - 127.0)


def float_to_e8m0(s: torch.Tensor) -> torch.Tensor:
    """Exact for powers of two (which is all the released scale rule produces)."""
    return s.float().to(E8M0)


def _blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    if x.shape[-1] % block:
        raise ValueError(f"last dimension {x.shape[-1]} is not a multiple of the block size {block}")
    return x.float().unflatten(-1, (-1, block))


def fp8_fake_quant(x: torch.Tensor, block: int = 128) -> torch.Tensor:
    """Rounds x to e4m3 with a UE8M0 scale per `block` along the last dim; returns x's dtype.

    This is the released activation quantization (block 128) and the KV simulation (block 64).
    """
    xb = _blocks(x, block)
    s = ue8m0_scale(xb.abs().amax(-1, keepdim=True), FP8_MAX)
    q = (xb / s).clamp(-FP8_MAX, FP8_MAX).to(E4M3)
    return (q.float() * s).flatten(-2).to(x.dtype)


def _e2m1_codes(v: torch.Tensor) -> torch.Tensor:
    """Nearest e2m1 code (0..15) of fp32 values already scaled into [-6, 6]; saturates at 6.

    Round to nearest, ties to the even code (what the hardware conversion
    cvt.rn.satfinite.e2m1x2 does, and how `.to(float8_e4m3fn)` rounds). The grid spacing is
    0.5 below 2, 1 in [2, 4) and 2 above, and an even multiple of the spacing is an even code,
    so torch.round (half to even) on v/spacing gives exactly that. Pure arithmetic with Python
    scalars: no lookup table is copied to the device, so this is capture-safe.
    """
    a = v.abs().clamp(max=FP4_MAX)
    step = torch.where(a < 2.0, 0.5, torch.where(a < 4.0, 1.0, 2.0))
    k = torch.round(a / step)  # value = k * step
    mag = torch.where(a < 2.0, k, torch.where(a < 4.0, k + 2.0, k + 4.0)).to(torch.uint8)
    neg = (torch.signbit(v) & (mag > 0)).to(torch.uint8)
    return mag | (neg << 3)


def _e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    """fp32 value of e2m1 codes: e = bits 1..2, m = bit 0; e == 0 is subnormal (m * 0.5)."""
    c = codes.to(torch.int32)
    e, m = (c >> 1) & 3, (c & 1).float()
    mag = torch.where(e == 0, 0.5 * m, (1.0 + 0.5 * m) * torch.exp2(e.float() - 1.0))
    return torch.where((c & 8) != 0, -mag, mag)


def fp4_fake_quant(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    """Rounds x to e2m1 with a UE8M0 scale per `block` (the indexer's simulated FP4)."""
    xb = _blocks(x, block)
    s = ue8m0_scale(xb.abs().amax(-1, keepdim=True), FP4_MAX, floor=1e-10)
    return (_e2m1_values(_e2m1_codes(xb / s)) * s).flatten(-2).to(x.dtype)


def hadamard(x: torch.Tensor) -> torch.Tensor:
    """Walsh-Hadamard rotation over the last dim (a power of two), scaled by 1/sqrt(n)."""
    n = x.shape[-1]
    if n & (n - 1):
        raise ValueError(f"hadamard needs a power-of-two size, got {n}")
    y = x.float()
    h = 1
    while h < n:
        y = y.unflatten(-1, (n // (2 * h), 2, h))
        a, b = y[..., 0, :], y[..., 1, :]
        y = torch.stack((a + b, a - b), dim=-2).flatten(-3)
        h *= 2
    return (y * n ** -0.5).to(x.dtype)


# ------------------------------------------------------------------ weights: FP8 128x128


def quantize_fp8_blockwise(w: torch.Tensor, block: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """[out, in] -> (e4m3 [out, in], UE8M0 [ceil(out/128), ceil(in/128)])."""
    out_f, in_f = w.shape
    po, pi = -out_f % block, -in_f % block
    wp = torch.nn.functional.pad(w.float(), (0, pi, 0, po))
    wb = wp.unflatten(0, (-1, block)).unflatten(-1, (-1, block))  # [bo, 128, bi, 128]
    s = ue8m0_scale(wb.abs().amax(dim=(1, 3), keepdim=True), FP8_MAX)
    q = (wb / s).clamp(-FP8_MAX, FP8_MAX).to(E4M3).flatten(2).flatten(0, 1)[:out_f, :in_f]
    return q.contiguous(), float_to_e8m0(s[:, 0, :, 0])


def dequantize_fp8_blockwise(q: torch.Tensor, scale: torch.Tensor, block: int = 128,
                             dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Any leading dims: [..., out, in] with scales [..., ceil(out/128), ceil(in/128)]."""
    s = e8m0_to_float(scale)
    out_f, in_f = q.shape[-2:]
    if out_f % block == 0 and in_f % block == 0:  # broadcast the block scale: no full-size scale tensor
        qb = q.float().unflatten(-1, (-1, block)).unflatten(-3, (-1, block))  # [..., bo, 128, bi, 128]
        return (qb * s.unsqueeze(-2).unsqueeze(-1)).flatten(-2).flatten(-3, -2).to(dtype)
    s = s.repeat_interleave(block, -2)[..., :out_f, :].repeat_interleave(block, -1)[..., :in_f]
    return (q.float() * s).to(dtype)


# ------------------------------------------------------------------ weights: FP4 e2m1 1x32


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [..., 2n] -> int8 [..., n]; the low nibble holds the even element."""
    codes = codes.to(torch.uint8)
    lo, hi = codes[..., 0::2], codes[..., 1::2]
    return (lo | (hi << 4)).view(torch.int8)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    u = packed.view(torch.uint8)
    return torch.stack((u & 0xF, u >> 4), dim=-1).flatten(-2)


def quantize_fp4(w: torch.Tensor, block: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """[out, in] -> (int8 packed [out, in/2], UE8M0 [out, in/32])."""
    wb = _blocks(w, block)
    s = ue8m0_scale(wb.abs().amax(-1, keepdim=True), FP4_MAX, floor=1e-10)
    codes = _e2m1_codes(wb / s).flatten(-2)
    return pack_fp4(codes), float_to_e8m0(s.squeeze(-1))


def dequantize_fp4(packed: torch.Tensor, scale: torch.Tensor, block: int = 32,
                   dtype: torch.dtype = torch.float32) -> torch.Tensor:
    vals = _byte_pairs(packed).unflatten(-1, (-1, block))
    return (vals * e8m0_to_float(scale).unsqueeze(-1)).flatten(-2).to(dtype)


def _byte_pairs(packed: torch.Tensor) -> torch.Tensor:
    """Packed e2m1 bytes -> fp32 values [..., 2n] through a 256 x 2 table (one gather, int32 indices)."""
    table = _e2m1_values(unpack_fp4(torch.arange(256, dtype=torch.uint8, device=packed.device).view(torch.int8)))
    idx = packed.view(torch.uint8).to(torch.int32)
    return torch.nn.functional.embedding(idx, table.view(256, 2)).flatten(-2)


# ------------------------------------------------------------------ weights: NVFP4


def quantize_nvfp4(w: torch.Tensor, block: int = 16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[out, in] -> (int8 packed [out, in/2], e4m3 [out, in/16], fp32 global scale [])."""
    wb = _blocks(w, block)
    gscale = (w.float().abs().amax() / (FP8_MAX * FP4_MAX)).clamp(min=1e-12)
    bscale = (wb.abs().amax(-1, keepdim=True) / FP4_MAX / gscale).clamp(max=FP8_MAX).to(E4M3)
    eff = bscale.float() * gscale
    codes = _e2m1_codes(torch.where(eff > 0, wb / eff, torch.zeros_like(wb))).flatten(-2)
    return pack_fp4(codes), bscale.squeeze(-1), gscale.reshape(())


def dequantize_nvfp4(packed: torch.Tensor, scale: torch.Tensor, global_scale: torch.Tensor, block: int = 16,
                     dtype: torch.dtype = torch.float32) -> torch.Tensor:
    vals = _e2m1_values(unpack_fp4(packed)).unflatten(-1, (-1, block))
    return (vals * (scale.float() * global_scale.float()).unsqueeze(-1)).flatten(-2).to(dtype)
