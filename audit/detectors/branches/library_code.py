"""Which traced code is an installed library's, for the rules that read the source of the functions a step ran.

A counter branch lives in a library as often as in the target: transformers' `StaticSlidingWindowLayer.update`
advances `self.cumulative_length_int` and tests `is_full = current_length >= self.max_cache_len`, so the layer takes
its index_copy side while the window fills and its roll side for ever after; a graph captured before the window
fills keeps writing past it. Torch's own frames (HIDDEN) stay out: their counters are the machinery's.
"""

from __future__ import annotations

from audit.scan.sources.user_code import LIBRARY


def is_library(ctx, code) -> bool:
    """The code object ran in the step and is an installed library's (not torch's, not the target's own)."""
    ent = ctx.trace.codes.get(id(code))
    return ent is not None and ent[0] is code and ent[1] == LIBRARY
