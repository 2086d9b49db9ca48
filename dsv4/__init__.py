"""A faithful DeepSeek-V4 inference stack: reference and graph-ready decode paths."""

from dsv4.config import ModelConfig, preset
from dsv4.errors import DSV4Error

__all__ = ["load", "ModelConfig", "preset", "DSV4Error"]


def load(source: str = "tiny", device="cpu", dtype: str = "bfloat16", seed: int = 0, **runtime):
    """A ready model: a preset name gets seeded random weights, a directory the checkpoint's."""
    from dsv4.loader import load as _load

    return _load(source, device=device, dtype=dtype, seed=seed, **runtime)
