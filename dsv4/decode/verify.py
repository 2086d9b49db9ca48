"""Replay verification: graph logits and state must be bitwise equal to the eager static path's.

Each step starts both from the same state: snapshot, eager step, record, restore, graph step,
compare. Same kernels on the same shapes give the same bits; any difference means the graph
replays something other than what eager runs (a baked value, a stale pointer, a missing kernel).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dsv4.decode.graph import CUDAGraphDecoder


@dataclass
class VerifyResult:
    steps: int = 0
    mismatched_steps: list[int] = field(default_factory=list)
    max_abs_diff: float = 0.0
    first_mismatch: str | None = None

    @property
    def ok(self) -> bool:
        return not self.mismatched_steps


@torch.no_grad()
def verify_replay(dec: CUDAGraphDecoder, steps: int = 64, prompt_len: int = 8, seed: int | None = None,
                  progress=None) -> VerifyResult:
    cfg = dec.model.cfg
    gen = torch.Generator().manual_seed(seed if seed is not None else torch.seed() % 2**31)
    B = dec.static.batch_size
    dec.prefill(torch.randint(0, cfg.vocab_size, (B, prompt_len), generator=gen))
    state = [dec.static.pos] + dec.cache_tensors()  # the eager step advances only the first position
    res = VerifyResult()
    for i in range(steps):
        dec.stage(torch.randint(0, cfg.vocab_size, (B,), generator=gen))
        snap = [t.clone() for t in state]
        eager = dec.static.step().clone()
        eager_state = [t.clone() for t in state]
        for t, s in zip(state, snap):
            t.copy_(s)
        graph = dec.step().clone()
        res.steps += 1
        diffs = [("logits", eager, graph)] + [(f"state[{k}]", e, t) for k, (e, t) in enumerate(zip(eager_state, state))]
        bad = [(name, e, g) for name, e, g in diffs if not torch.equal(e, g)]
        if bad:
            res.mismatched_steps.append(i)
            name, e, g = bad[0]
            d = (e.float() - g.float()).abs().max().item()
            res.max_abs_diff = max(res.max_abs_diff, d)
            res.first_mismatch = res.first_mismatch or f"step {i}: {name} differs (max abs diff {d:.3g})"
        if progress is not None:
            progress()
    return res
