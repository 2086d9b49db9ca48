"""Layers split across devices in contiguous segments; works for any number of devices.

The embedding goes with the first segment, the final collapse, norm, head and MTP with the last.
Naming the same device twice (devices=[0, 0]) makes two segments on one GPU, which exercises the
multi-segment code (copies between segments, one graph per segment) on a one-GPU machine.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsv4.errors import DSV4Error
from dsv4.model import Transformer


@dataclass
class Placement:
    device: torch.device
    layers: range


def as_device(d) -> torch.device:
    if isinstance(d, int):
        return torch.device("cuda", d)
    dev = torch.device(d)
    return torch.device("cuda", torch.cuda.current_device() if dev.index is None else dev.index) \
        if dev.type == "cuda" else dev


def split_layers(n_layers: int, n_segments: int) -> list[range]:
    """Balanced contiguous ranges; earlier segments take the remainder."""
    if not 1 <= n_segments <= n_layers:
        raise DSV4Error(f"cannot split {n_layers} layers into {n_segments} device segments")
    base, extra = divmod(n_layers, n_segments)
    out, start = [], 0
    for s in range(n_segments):
        size = base + (1 if s < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out


def place(model: Transformer, devices) -> list[Placement]:
    """Moves each segment's layers to its device; returns the placement (model edited in place)."""
    devs = [as_device(d) for d in devices]
    if any(d.type == "cuda" for d in devs) and not torch.cuda.is_available():
        raise DSV4Error("multi-device placement needs CUDA")
    n_gpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    bad = [d for d in devs if d.type == "cuda" and d.index >= n_gpu]
    if bad:
        raise DSV4Error(f"device {bad[0]} does not exist ({n_gpu} CUDA device(s) visible)")
    segments = [Placement(d, r) for d, r in zip(devs, split_layers(model.cfg.n_layers, len(devs)))]
    model.embed.to(devs[0])
    for seg in segments:
        for i in seg.layers:
            model.layers[i].to(seg.device)
            model.layers[i].attn.cache = None
    last = devs[-1]
    for name in ("head", "norm", "mtp"):
        getattr(model, name).to(last)
    for name in ("hc_head_fn", "hc_head_base", "hc_head_scale"):
        p = getattr(model, name)
        p.data = p.data.to(last)
    return segments


def current_placement(model: Transformer) -> list[Placement]:
    """The segments as the model is placed now (runs of consecutive layers on one device)."""
    segs: list[Placement] = []
    for i, layer in enumerate(model.layers):
        if segs and segs[-1].device == layer.device and segs[-1].layers.stop == i:
            segs[-1] = Placement(layer.device, range(segs[-1].layers.start, i + 1))
        else:
            segs.append(Placement(layer.device, range(i, i + 1)))
    return segs
