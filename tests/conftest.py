"""Shared fixtures: fresh randomness per run, and skipping GPU tests without CUDA."""

from __future__ import annotations

import os

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rng() -> torch.Generator:
    """A generator seeded from the OS: every run draws fresh inputs; the seed is printed on failure."""
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"rng seed {seed}")
    return torch.Generator().manual_seed(seed)
