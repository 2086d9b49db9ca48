"""Per-sequence bookkeeping in a dataclass(slots=True), advanced by a module-level function (the hazard:
the statement lives in neither the target's files nor the class body), with a device-side twin."""

import dataclasses

import torch


@dataclasses.dataclass(slots=True)
class SeqState:
    seq_id: int
    num_computed: int = 0
    pos: torch.Tensor | None = None


def advance(state: SeqState, logits: torch.Tensor) -> torch.Tensor:
    state.num_computed += 1  # HAZARD: cpu-side-effect
    return logits.argmax(-1, keepdim=True)


def advance_on_device(state: SeqState, logits: torch.Tensor) -> torch.Tensor:
    state.pos.add_(1)
    return logits.argmax(-1, keepdim=True)
