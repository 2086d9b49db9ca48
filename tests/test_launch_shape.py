"""The FP8 GEMV's launch shape (warps, prefetch depth, row blocks per CTA): the measured batch-1 rule, a
depth never past a row's steps, and launch.TUNE overriding each choice alone (the kernel bench's sweep)."""

from __future__ import annotations

import random

import pytest

from dsv4.kernels import launch


@pytest.fixture(autouse=True)
def _tune():
    saved = dict(launch.TUNE)
    yield
    launch.TUNE.clear()
    launch.TUNE.update(saved)


def test_depth_never_past_the_row():
    for steps in range(1, 40):
        for M in (1, 2, 8, 64):
            for G in (1, 8):
                warps, pd, rb = launch.fp8_shape(M, G, steps)
                assert 1 <= pd <= steps and rb >= 1 and warps in (4, 8)


def test_batch1_rule():
    assert launch.fp8_shape(1, 1, 2) == (4, 2, 2)       # wq_b: short rows, two blocks a CTA
    assert launch.fp8_shape(1, 1, 16) == (8, 8, 1)      # wo_b: long rows, 8 warps, every step in flight
    assert launch.fp8_shape(1, 8, 8) == (4, 4, 1)       # wo_a's groups keep the default
    assert launch.fp8_shape(16, 1, 2) == (4, 2, 1)      # larger batches keep one block


def test_tune_overrides_each_choice():
    steps = random.choice((2, 4, 8, 16))
    base = launch.fp8_shape(1, 1, steps)
    for key, i, value in (("warps", 0, 2), ("pd8", 1, 1), ("rb8", 2, 3)):
        launch.TUNE[key] = value
        got = launch.fp8_shape(1, 1, steps)
        assert got[i] == value and all(got[j] == base[j] for j in range(3) if j != i)
        launch.TUNE[key] = None


def test_the_tensor_core_fp4_kernel_takes_only_what_it_can(monkeypatch):
    """DSV4_CUTE_MMA=1 (or TUNE["mma"]) sends batch-1 FP4 rows (rounded in the kernel or not) whose K is whole
    128-steps to the tensor-core kernel; NVFP4 and other K stay on the CUDA-core kernel."""
    monkeypatch.setenv("DSV4_CUTE_MMA", "1")
    blocks = 4 * random.randint(1, 64)
    assert launch._uses_mma("fp4", blocks)
    assert not launch._uses_mma("nvfp4", blocks)
    assert not launch._uses_mma("fp4", blocks + 1)
    launch.TUNE["mma"] = 0  # TUNE wins over the environment
    assert not launch._uses_mma("fp4", blocks)
    launch.TUNE["mma"] = None
    monkeypatch.setenv("DSV4_CUTE_MMA", "0")
    assert not launch._uses_mma("fp4", blocks)


def test_grouped_slots_take_the_tensor_core_kernel_up_to_four_rows_per_expert(monkeypatch):
    """The grouped FP4 launch hands its slots to the tensor-core kernel at <= 4 rows per expert on average
    (batch 16 at 32 experts: 96 rows), not above (each 8 rows of a slot re-read the expert); FP4 and whole
    128-steps only; DSV4_CUTE_MMA_SLOTS forces either way; never without the CuTe DSL."""
    monkeypatch.delenv("DSV4_CUTE_MMA_SLOTS", raising=False)
    monkeypatch.setattr(launch, "_AVAILABLE", [True])
    E = random.choice((8, 32, 256))
    assert launch.slots_mma("fp4", 4096, 4 * E, E) and not launch.slots_mma("fp4", 4096, 4 * E + 1, E)
    assert not launch.slots_mma("nvfp4", 4096, E, E) and not launch.slots_mma("fp4", 4096 + 64, E, E)
    monkeypatch.setenv("DSV4_CUTE_MMA_SLOTS", "0")
    assert not launch.slots_mma("fp4", 4096, E, E)
    monkeypatch.setenv("DSV4_CUTE_MMA_SLOTS", "1")
    assert launch.slots_mma("fp4", 4096, 12 * E, E)
    launch.TUNE["mma_slots"] = 0
    assert not launch.slots_mma("fp4", 4096, E, E)
    monkeypatch.setattr(launch, "_AVAILABLE", [False])
    launch.TUNE["mma_slots"] = 1
    assert not launch.slots_mma("fp4", 4096, E, E)
