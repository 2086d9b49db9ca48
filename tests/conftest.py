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


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    """The tiny model's ops are too small to gain from threads; on a shared, loaded CPU the OpenMP
    hand-offs cost milliseconds per op, so the suite runs single-threaded."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _fresh_global_rng():
    """Inputs drawn from torch's global RNG are fresh every run; the seed is shown on failure, and
    TEST_TORCH_SEED=<seed> replays it."""
    seed = int(os.environ.get("TEST_TORCH_SEED") or int.from_bytes(os.urandom(4), "little"))
    print(f"global torch seed {seed}")
    torch.manual_seed(seed)


@pytest.fixture
def kernels_on():
    """The decode kernels switched on for one test (dsv4.kernels.use), then back to the previous setting."""
    from dsv4 import kernels

    before = kernels.use(True)
    yield
    kernels.use(before)



@pytest.fixture
def one_rank():
    """A one-rank gloo process group for the test, destroyed after it (the distributed audit tests)."""
    import torch.distributed as dist

    if not dist.is_available():
        pytest.skip("torch.distributed is not built")
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
