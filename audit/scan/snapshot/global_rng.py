"""The process-wide host random generators: Python's `random` module and numpy's legacy `np.random`.

`random.random()` or `np.random.rand()` in the step (a speculative-acceptance coin, a jittered
temperature) advances a generator whose state lives in C inside those modules: no attribute of the
target changes, so the state snapshot would not see it. Their states are hashed around each audited step
(numpy's only when numpy is already imported), under the owner "<global rng>"; the side-effect rule
audit/detectors/global_rng.py finds the drawing line.
"""

from __future__ import annotations

import random
import sys

__all__ = ["OWNER", "snapshot"]

OWNER = "<global rng>"


def snapshot() -> dict:
    out = {(OWNER, "random"): hash(random.getstate())}
    np = sys.modules.get("numpy")
    if np is not None:
        try:
            name, keys, pos, has_gauss, gauss = np.random.get_state()
            out[(OWNER, "numpy.random")] = hash((name, keys.tobytes(), pos, has_gauss, gauss))
        except Exception:  # noqa: BLE001 - a numpy without the legacy global generator
            pass
    return out
