"""Tile overrides for the Triton GEMMs from DSV4_TRITON_TUNE, for sweeps and A/B runs.

DSV4_TRITON_TUNE='{"fp8": {"bn": 64}, "experts": {"bn": 64, "warps": 8}}' sets the kernel modules'
`TUNE` dicts when they are imported (empty: the built-in `tiles()` rules); `python -m
dsv4.kernels.tune` prints the value a sweep found best, and the bench records it in its notes.
"""

from __future__ import annotations

import json
import os

KINDS = ("fp8", "experts")


def from_env(kind: str) -> dict:
    """The overrides DSV4_TRITON_TUNE gives `kind` ({} when unset)."""
    raw = os.environ.get("DSV4_TRITON_TUNE", "").strip()
    if not raw:
        return {}
    table = json.loads(raw)
    if not isinstance(table, dict) or not set(table) <= set(KINDS):
        raise ValueError(f"DSV4_TRITON_TUNE: expected a JSON object with keys from {KINDS}, got {raw!r}")
    return {str(k): int(v) for k, v in table.get(kind, {}).items()}
