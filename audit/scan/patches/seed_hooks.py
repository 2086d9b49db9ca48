"""The reseeding calls hooked in the step, and the seed each one passed.

Under capture a CUDA generator judges a reseed by its value (CUDAGeneratorImpl::set_current_seed): a
seed other than its own raises, the same one is a no-op that leaves the philox offset where it was. So
the rng rule needs the values the steps passed to tell a capture that fails from a replay that drifts.
"""

from __future__ import annotations

import numbers

import torch

__all__ = ["BY_VALUE", "SEEDERS", "seed_note"]

SEEDERS = [(torch, "manual_seed", "torch.manual_seed"), (torch.random, "manual_seed", "torch.manual_seed"),
           (torch, "set_rng_state", "torch.set_rng_state"), (torch.random, "set_rng_state", "torch.set_rng_state"),
           (torch.cuda, "manual_seed", "torch.cuda.manual_seed"),
           (torch.cuda, "manual_seed_all", "torch.cuda.manual_seed_all"),
           (torch.cuda, "set_rng_state", "torch.cuda.set_rng_state"),
           (torch.cuda, "set_rng_state_all", "torch.cuda.set_rng_state_all"),
           (torch.cuda, "seed", "torch.cuda.seed"), (torch.cuda, "seed_all", "torch.cuda.seed_all")]

# These set the default CUDA generator's seed to the value passed (set_rng_state also moves its offset,
# and seed() draws a fresh one: neither passes capture whatever the value).
BY_VALUE = ("torch.manual_seed", "torch.cuda.manual_seed", "torch.cuda.manual_seed_all")


def seed_note(label: str):
    """For a by-value seeder, a function giving the record's note ("seed=N") from the call's arguments;
    a seed held in a tensor is not read (that would be a host read of its own)."""
    if label not in BY_VALUE:
        return None

    def note(*args, **kwargs) -> str:
        seed = args[0] if args else kwargs.get("seed")
        return f"seed={int(seed)}" if isinstance(seed, numbers.Integral) else ""

    return note
