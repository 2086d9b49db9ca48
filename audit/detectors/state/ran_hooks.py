"""The module hooks torch ran in a step, as places where the step changed an object it was handed.

A hook runs no torch op of its own more often than not (a `with_kwargs` forward hook advancing
`kwargs["cache"].seqlen_offset`), so no op record carries its frame and it is missing from the functions
"that ran" which the cpu-side-effect rule searches first; the changed object's own class then offered a
method that never ran (`MambaCache.advance`). The tracer notes the hooks of every module call
(`trace.hook_calls`): their functions in library code ran, and are searched like the functions that ran ops.
"""

from __future__ import annotations

from audit.detectors.state.sites import code_span
from audit.scan.patches import module_hooks
from audit.scan.sources.user_code import LIBRARY, frame_kind


def hook_spans(ctx, step: int) -> list:
    """(file, span, False) of each library hook function torch ran from a module call in the step."""
    calls = ctx.trace.hook_calls[step] if step < len(ctx.trace.hook_calls) else ()
    out = {}
    for hooks, _mod, _stack in calls:
        for fn in map(module_hooks.function_of, hooks):
            code = getattr(fn, "__code__", None)
            if code is not None and frame_kind(code.co_filename, ctx.trace.roots) == LIBRARY:
                out[(code.co_filename, code.co_firstlineno)] = (code.co_filename, code_span(code), False)
    return [out[k] for k in sorted(out)]
