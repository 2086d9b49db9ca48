"""`dsv4.load`: a preset name or a checkpoint directory -> a ready Transformer.

Sits above model, init and checkpoint so that none of them imports another one's caller.
"""

from __future__ import annotations

from pathlib import Path

import torch

from dsv4.checkpoint import load_model
from dsv4.config import preset
from dsv4.errors import DSV4Error
from dsv4.init import init_random_
from dsv4.model import Transformer

__all__ = ["load"]


def load(source: str = "tiny", device="cpu", dtype: str = "bfloat16", seed: int = 0, **runtime) -> Transformer:
    """A preset name -> seeded random weights in the released formats; a directory -> its checkpoint."""
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise DSV4Error("device cuda requested but CUDA is not available")
    if Path(str(source)).is_dir():
        return load_model(source, device=device, dtype=dtype, **runtime)
    cfg = preset(str(source), dtype=dtype, **runtime)
    with torch.device(device):
        model = Transformer(cfg, device=device)
    init_random_(model, seed)
    return model.eval()
