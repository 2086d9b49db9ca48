"""Tensors with no elements: no byte of them is read or written, so their address does not matter.

A streaming cache keeps an empty slot for a layer without left context (`torch.empty(B, C, 0)` as the padding
of a pointwise convolution, rebuilt by every call) and concatenates it in front of the next step's input. The
allocation escapes into state like any other, and a replay reads the captured one, but reading zero elements
from a stale address reads nothing: no silent corruption. The same holds for an empty input rebound between
steps. Their shapes are still compared (a slot that is empty in some steps only is a dynamic-shape).
"""

from __future__ import annotations


def holds_nothing(meta) -> bool:
    """Whether the tensor has no elements (a 0-dim tensor has one)."""
    return any(d == 0 for d in meta.shape)


def allocates_nothing(rec) -> bool:
    """Whether every storage the op created belongs to an output with no elements."""
    made = [m for m, new in zip(rec.outputs, rec.new) if new]
    return bool(made) and all(holds_nothing(m) for m in made)
