"""Pointwise fusion of the static step by inductor, underneath our own CUDA graphs.

The static step is launch-bound, not bandwidth-bound: a flash-h200 layer issues ~800 small ops
(Sinkhorn iterations, FP8 activation rounding, norms, RoPE, masks) around a dozen weight GEMVs,
and even replayed from a graph each op costs a kernel. `fuse_layers` hands each layer's step
functions to torch.compile (inductor, no cudagraph trees: CUDAGraphDecoder captures the result
itself), which merges the elementwise chains into a few Triton kernels while the weight-only
GEMVs stay our own kernels (custom ops in dsv4/kernels/ops.py, opaque to inductor).

Numerics: `emulate_precision_casts` makes inductor round every explicit bf16 cast as eager does
(without it a fused chain keeps fp32 intermediates and the logits drift by percents in bfloat16
mode); what remains is fp32 summation order. Layers with the same structure (compress ratio,
hash or learned routing) share one compiled graph, so flash's 43 layers compile ~5 graphs.
The replacement is per StaticLayer instance: another decoder over the same model is unaffected.

Programmatic dependent launch (DSV4_PDL, on by default; dsv4/kernels/_pdl.py): inductor's kernels
wait for the previous grid in-kernel, so each launch overlaps the previous kernel's tail.

DSV4_INDUCTOR="name=value,..." adds inductor options for an experiment (e.g. combo_kernels=1,
split_reductions=0); the bench records them in its row notes.
"""

from __future__ import annotations

import os

import torch
from torch._inductor import config as inductor_config

from dsv4 import kernels
from dsv4.errors import DSV4Error

INDUCTOR_OPTIONS = {"emulate_precision_casts": True}
STEP_FUNCTIONS = {"full": ("forward",), "eager": ("forward",), "ab": ("part_a", "part_attn", "part_b")}


def extra_options() -> dict:
    """Inductor options from DSV4_INDUCTOR ("name=value,..."; values 0/1/true/false/ints)."""
    out = {}
    for item in filter(None, (i.strip() for i in os.environ.get("DSV4_INDUCTOR", "").split(","))):
        name, sep, value = item.partition("=")
        if not sep:
            raise DSV4Error(f"DSV4_INDUCTOR: expected name=value, got {item!r}")
        v = value.strip().lower()
        out[name.strip()] = {"1": True, "true": True, "0": False, "false": False}.get(v, int(v) if v.isdigit() else value)
    return out


def options() -> dict:
    """The inductor options of our compiles: the explicit casts kept, PDL launches where the switch and
    this torch allow (dsv4/kernels/_pdl.py), then DSV4_INDUCTOR's."""
    pdl = {"triton.enable_pdl": True} if kernels.pdl() and hasattr(inductor_config.triton, "enable_pdl") else {}
    return {**INDUCTOR_OPTIONS, **pdl, **extra_options()}


def compiled(fn):
    """fn under inductor: static shapes, the model's explicit casts kept."""
    return torch.compile(fn, dynamic=False, options=options())


def fuse_layers(layers, mode: str) -> None:
    """Replaces each layer's step functions for `mode` by their compiled versions, in place. They compile
    on their first calls: make those under `compile_room()`."""
    for layer in layers:
        for name in STEP_FUNCTIONS[mode]:
            setattr(layer, name, compiled(getattr(layer, name)))


def compile_room(entries: int = 64):
    """Dynamo's per-function entry limit raised for the calls that compile the fused step, and only them.

    Every layer's functions share one code object, so dynamo keeps an entry per layer structure, more than
    its default of 8; past the limit it would run the rest eagerly. Once built, the steps hit those entries
    and the limit is not consulted again, so the process-wide setting stays the user's."""
    return torch._dynamo.config.patch(recompile_limit=max(entries, torch._dynamo.config.recompile_limit))


def fuse_ends(net) -> None:
    """The embedding and the head (hc_head collapse, final norm, LM head GEMV) of a StaticModel."""
    net.embed = compiled(net.embed)
    net.head = compiled(net.head)
