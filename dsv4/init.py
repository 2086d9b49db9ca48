"""Seeded random weights in the released formats, scaled so activations stay O(1) through depth.

Dense weights are drawn in fp32 on the target device and quantized into each Linear's own format
(FP8 blocks, packed FP4, NVFP4), so a preset model has the same storage as a real checkpoint.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from dsv4.layers.linear import Linear
from dsv4.layers.moe import Gate
from dsv4.layers.norm import RMSNorm
from dsv4.layers.compressor import Compressor

# output projections into the residual streams get a depth-scaled std
_RESIDUAL_OUT = ("wo_b", "w2")


@torch.no_grad()
def init_random_(model: nn.Module, seed: int) -> None:
    cfg = model.cfg
    dev = next(model.parameters()).device
    gen = torch.Generator(device=dev).manual_seed(seed)

    def randn(*shape, std=1.0):
        return torch.randn(shape, generator=gen, device=dev, dtype=torch.float32) * std

    depth = math.sqrt(2 * (cfg.n_layers + cfg.n_mtp_layers))
    for name, mod in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if isinstance(mod, Linear):
            std = 1 / math.sqrt(mod.in_features)
            if leaf in _RESIDUAL_OUT:
                std /= depth
            mod.load_dense(randn(mod.out_features, mod.in_features, std=std))
        elif isinstance(mod, RMSNorm):
            mod.weight.copy_((1 + randn(mod.weight.numel(), std=0.1)).to(mod.weight.dtype))
        elif isinstance(mod, Compressor):
            mod.ape.copy_(randn(*mod.ape.shape, std=0.5))
        elif isinstance(mod, Gate):
            mod.weight.copy_(randn(*mod.weight.shape, std=1 / math.sqrt(cfg.dim)).to(torch.bfloat16))
            if mod.hash:
                pick = torch.rand(cfg.vocab_size, cfg.n_routed_experts, generator=gen, device=dev)
                mod.tid2eid.copy_(pick.argsort(dim=-1)[:, : mod.topk])
            else:
                mod.bias.copy_(randn(cfg.n_routed_experts, std=0.1))
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if leaf.endswith("_fn"):  # mHC projections: mixes ~ N(0, 1) for unit-RMS streams
            p.copy_(randn(*p.shape, std=1 / math.sqrt(p.shape[1])))
        elif leaf.endswith("_base"):
            p.copy_(randn(*p.shape, std=0.5))
        elif leaf.endswith("_scale") and leaf.startswith("hc_"):
            p.copy_(0.5 + 0.5 * torch.rand(p.shape, generator=gen, device=dev))
        elif leaf == "attn_sink":
            p.copy_(randn(*p.shape))
        elif name in ("embed.weight",):
            p.copy_(randn(*p.shape).to(p.dtype))
        elif name == "head.weight":
            p.copy_(randn(*p.shape, std=1 / math.sqrt(cfg.dim)).to(p.dtype))
