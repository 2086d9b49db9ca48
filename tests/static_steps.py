"""A helper the decode tests share: logits of a StaticDecoder's eager steps."""

from __future__ import annotations

import torch


def static_decode(model, prompt: torch.Tensor, ids) -> torch.Tensor:
    """Logits of a StaticDecoder's eager steps after prefilling `prompt` [B, T]; the model is reset after."""
    from dsv4.decode.static import StaticDecoder

    dec = StaticDecoder(model, prompt.shape[0])
    dec.prefill(prompt)
    out = torch.stack([dec.decode(i).clone() for i in ids])
    model.reset()
    return out
