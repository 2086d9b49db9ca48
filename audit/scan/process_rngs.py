"""The process-wide host random generators, as state a step can change.

`random.random()` and `np.random.uniform(...)` draw from generators that live in the stdlib's and numpy's own
module globals (`random._inst`, `numpy.random.mtrand._rand`), which the state snapshot leaves out with the rest
of those modules. A MoE router drawing its jitter or a token-drop decision from them in the step advances them
once per eager step; a replay never does. Their state is fingerprinted here, under the owner OWNER.
"""

from __future__ import annotations

import sys

from audit.scan.fingerprint import fp as fingerprint

OWNER = "<process rng>"


def generators() -> list[tuple[str, object]]:
    """(module name the user writes, generator) for the process-wide host generators loaded now."""
    out = []
    if (rnd := sys.modules.get("random")) is not None and hasattr(rnd, "_inst"):
        out.append(("random", rnd._inst))
    mt = sys.modules.get("numpy.random.mtrand")
    if mt is not None and getattr(mt, "_rand", None) is not None:
        out.append(("numpy.random", mt._rand))
    return out


def snapshot() -> dict:
    return {(OWNER, name): fingerprint(g) for name, g in generators()}
