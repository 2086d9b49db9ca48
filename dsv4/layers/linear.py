"""Linear layers that keep their weights in the released format and compute through a twin.

Storage is the checkpoint's own bytes (FP8 + UE8M0, packed FP4 + UE8M0, NVFP4, or bf16), so a
loaded model's parameter bytes match its on-disk bytes. The forward pass is the pure-torch twin:
dequantize to fp32 and matmul. In bfloat16 mode the input is first rounded to FP8 per 128-block
(the released dynamic activation quantization); in float32 mode nothing is rounded.
"""

from __future__ import annotations

import torch
from torch import nn

from dsv4 import kernels
from dsv4.config import ModelConfig
from dsv4.ops import quantize as Q

__all__ = ["FORMATS", "Linear", "no_reduce"]

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
        if self.fmt == "bf16":
            return self.weight.to(dtype)
        if self.fmt == "fp8":
            return Q.dequantize_fp8_blockwise(self.weight, self.scale, dtype=dtype)
        if self.fmt == "fp4":
            return Q.dequantize_fp4(self.weight, self.scale, dtype=dtype)
        return Q.dequantize_nvfp4(self.weight, self.scale, self.global_scale, dtype=dtype)

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
        """The released dynamic FP8 activation rounding (bfloat16 mode, quantized weights only)."""
        if self.simulate_quant and self.fmt != "bf16":
            return Q.fp8_fake_quant(x, 128)
        return x

    def forward(self, x: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        x = self.quantize_input(x.to(self.act_dtype))
        y = self.kernel(x)  # the decode kernel when switched on and applicable (CUDA), else None
        if y is not None:
            return y.to(out_dtype or self.act_dtype)
        y = torch.matmul(x.float(), self.dequantized(torch.float32).t())
        return y.to(out_dtype or self.act_dtype)

    def kernel(self, x: torch.Tensor) -> torch.Tensor | None:
        if self.fmt == "fp8":
            return kernels.dense_gemv(x, self.weight, self.scale)
        if self.fmt == "bf16":
            return kernels.bf16_dense_gemv(x.float(), self.weight)
        return None

    def extra_repr(self) -> str:
        return f"{self.in_features} -> {self.out_features}, {self.fmt}"
