"""Linear layers that keep their weights in the released format and compute through a twin.

Storage is the checkpoint's own bytes (FP8 + UE8M0, packed FP4 + UE8M0, NVFP4, or bf16), so a
loaded model's parameter bytes match its on-disk bytes. The forward pass is the pure-torch twin:
dequantize to fp32 and matmul. In bfloat16 mode the input is first rounded to FP8 per 128-block
(the released dynamic activation quantization); in float32 mode nothing is rounded.
"""

from __future__ import annotations

import torch
from torch import nn

from types import SimpleNamespace

from dsv4 import kernels
from dsv4.config import ModelConfig
from dsv4.ops import quantize as Q

__all__ = ["FORMATS", "Linear", "no_reduce", "fuse_rows", "rows_forward", "linear_forward"]

FORMATS = ("bf16", "fp8", "fp4", "nvfp4")


def no_reduce(t: torch.Tensor) -> torch.Tensor:
    """The default `reduce` hook of Attention and MoE: with one rank the partial sum is the sum."""
    return t


def _frozen(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t, requires_grad=False)


class Linear(nn.Module):
    """y = x W^T with W held as `fmt`; parameters named as in the released safetensors."""

    def __init__(self, in_features: int, out_features: int, fmt: str, cfg: ModelConfig, device=None):
        super().__init__()
        if fmt not in FORMATS:
            raise ValueError(f"unknown weight format {fmt!r}")
        self.in_features, self.out_features, self.fmt = in_features, out_features, fmt
        self.simulate_quant = cfg.simulate_quant
        self.act_dtype = cfg.act_dtype
        for name, (shape, dtype) in self.param_specs(in_features, out_features, fmt).items():
            setattr(self, name, _frozen(torch.empty(shape, dtype=dtype, device=device)))

    @staticmethod
    def param_specs(in_features: int, out_features: int, fmt: str) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Released tensor names, shapes and dtypes for one linear of this format."""
        if fmt == "bf16":
            return {"weight": ((out_features, in_features), torch.bfloat16)}
        if fmt == "fp8":
            return {"weight": ((out_features, in_features), Q.E4M3),
                    "scale": ((-(-out_features // 128), -(-in_features // 128)), Q.E8M0)}
        if fmt == "fp4":
            return {"weight": ((out_features, in_features // 2), torch.int8),
                    "scale": ((out_features, in_features // 32), Q.E8M0)}
        return {"weight": ((out_features, in_features // 2), torch.int8),
                "scale": ((out_features, in_features // 16), Q.E4M3),
                "global_scale": ((), torch.float32)}

    # ------------------------------------------------------------------ weights
    def dequantized(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return dequantized(self, dtype)

    @torch.no_grad()
    def load_dense(self, w: torch.Tensor) -> None:
        """Quantizes a dense [out, in] weight into this layer's format (on the layer's device)."""
        w = w.to(self.weight.device, torch.float32)
        if self.fmt == "bf16":
            self.weight.copy_(w.to(torch.bfloat16))
        elif self.fmt == "fp8":
            q, s = Q.quantize_fp8_blockwise(w)
            self.weight.copy_(q), self.scale.copy_(s)
        elif self.fmt == "fp4":
            q, s = Q.quantize_fp4(w)
            self.weight.copy_(q), self.scale.copy_(s)
        else:
            q, s, g = Q.quantize_nvfp4(w)
            self.weight.copy_(q), self.scale.copy_(s), self.global_scale.copy_(g)

    # ------------------------------------------------------------------ forward
    def quantize_input(self, x: torch.Tensor) -> torch.Tensor:
        return quantize_input(self, x)

    def forward(self, x: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        return linear_forward(self, x, out_dtype)

    def extra_repr(self) -> str:
        return f"{self.in_features} -> {self.out_features}, {self.fmt}"


# ---------------------------------------------------------------------- one GEMV for linears sharing x
def _stack(parts: list[torch.Tensor]) -> torch.Tensor:
    """The row-concatenation of parts: a view when they already sit back to back in one storage
    (a second decoder over the same model), else a new tensor."""
    a = parts[0]
    if all(p.is_contiguous() and p.untyped_storage().data_ptr() == a.untyped_storage().data_ptr()
           for p in parts):
        off = a.storage_offset()
        for p in parts:
            if p.storage_offset() != off:
                break
            off += p.numel()
        else:
            rows = sum(p.shape[0] for p in parts)
            return a.as_strided((rows, *a.shape[1:]), a.stride(), a.storage_offset())
    return torch.cat([p.data for p in parts])


@torch.no_grad()
def fuse_rows(owner: nn.Module, names: tuple[str, ...]) -> bool:
    """Stacks the rows of owner's Linears `names` (same input, same format) into one Linear, so a
    decode step runs one GEMV launch (and one FP8 activation rounding) instead of len(names).

    The Linears' parameters become views into the stack: a later load still lands, nothing is
    held twice, and each Linear alone computes what it did. FP8 needs whole 128-row scale blocks;
    NVFP4 (a global scale per Linear) and mixed formats are left alone (returns False)."""
    lins = [getattr(owner, n) for n in names]
    fmt = lins[0].fmt
    if (fmt not in ("bf16", "fp8", "fp4") or any(l.fmt != fmt or l.in_features != lins[0].in_features for l in lins)
            or (fmt == "fp8" and any(l.out_features % 128 for l in lins))):
        return False
    first = lins[0]
    cfg = SimpleNamespace(simulate_quant=first.simulate_quant, act_dtype=first.act_dtype)
    fused = Linear(first.in_features, sum(l.out_features for l in lins), fmt, cfg, device="meta")
    for pname in Linear.param_specs(1, 1, fmt):
        stacked = _stack([getattr(l, pname) for l in lins])
        setattr(fused, pname, _frozen(stacked))
        row = 0
        for lin in lins:
            n = getattr(lin, pname).shape[0]
            setattr(lin, pname, _frozen(stacked[row:row + n]))
            row += n
    if getattr(owner, "fused_rows", None) is None:
        owner.fused_rows = {}  # a plain dict attribute: the stack adds no state-dict keys or submodules
    owner.fused_rows["+".join(names)] = fused
    return True


def rows_forward(owner: nn.Module, names: tuple[str, ...], x: torch.Tensor,
                 out_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, ...]:
    """The outputs of owner's Linears `names` on x: one GEMV when fuse_rows stacked them."""
    table = getattr(owner, "fused_rows", None)
    fused = None if table is None else table.get("+".join(names))
    if fused is None:
        return tuple(getattr(owner, n)(x, out_dtype) for n in names)
    return fused(x, out_dtype).split([getattr(owner, n).out_features for n in names], dim=-1)


# ---------------------------------------------------------------------- the forward as functions
# They take any object with a Linear's format attributes (fmt, simulate_quant, act_dtype) and its
# tensors (weight, scale, global_scale as the format has them): a Linear, or the view of one that a
# custom op rebuilds from its tensor arguments (dsv4/decode/aside.py).

def dequantized(lin, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    if lin.fmt == "bf16":
        return lin.weight.to(dtype)
    if lin.fmt == "fp8":
        return Q.dequantize_fp8_blockwise(lin.weight, lin.scale, dtype=dtype)
    if lin.fmt == "fp4":
        return Q.dequantize_fp4(lin.weight, lin.scale, dtype=dtype)
    return Q.dequantize_nvfp4(lin.weight, lin.scale, lin.global_scale, dtype=dtype)


def quantize_input(lin, x: torch.Tensor) -> torch.Tensor:
    """The released dynamic FP8 activation rounding (bfloat16 mode, quantized weights only)."""
    if lin.simulate_quant and lin.fmt != "bf16":
        return Q.fp8_fake_quant(x, 128)
    return x


def linear_forward(lin, x: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x W^T: the decode kernel when switched on and applicable (CUDA), else the twin."""
    x = x.to(lin.act_dtype)
    out_dtype = out_dtype or lin.act_dtype
    if lin.fmt == "fp8" and lin.simulate_quant and kernels.rounds_in_kernel(x):
        y = kernels.dense_gemv(x, lin.weight, lin.scale, quant=True)  # rounding in the prologue
        if y is not None:
            return y.to(out_dtype)
    x = quantize_input(lin, x)
    y = _kernel(lin, x)
    if y is None:
        y = torch.matmul(x.float(), dequantized(lin, torch.float32).t())
    return y.to(out_dtype)


def _kernel(lin, x: torch.Tensor) -> torch.Tensor | None:
    if lin.fmt == "fp8":
        return kernels.dense_gemv(x, lin.weight, lin.scale)
    if lin.fmt == "bf16":
        return kernels.bf16_dense_gemv(x.float(), lin.weight)
    return None
