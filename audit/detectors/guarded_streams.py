"""unjoined-stream the run could not see: side-stream blocks in device branches a CPU scan never takes.

A prefetcher that makes its copy stream only where a GPU is (`self.stream = torch.cuda.Stream() if
torch.cuda.is_available() else None`) and tests it in the step (`if self.stream is not None:`) runs its other
arm on a laptop, so the stream events the streams rule replays never happen there. The GPU arm is read from the
source instead (the same untaken sides guarded_sync reads): a `with torch.cuda.stream(s):` block there with no
fork before it in its function (`s.wait_stream(...)` / `s.wait_event(...)`, or `s` handed to a helper) is a
missing fork; one forked but never waited on after it (`cur.wait_stream(s)`, a wait on an event, `s` handed to a
helper) is a missing join. CUDA scans skip this rule: there the arm either ran (and was traced) or is not taken.
"""

from __future__ import annotations

import ast

from audit.detectors import register
from audit.detectors.guarded_sync import untaken_sides
from audit.detectors.source import lookup

_CONTEXTS = ("stream", "StreamContext")
_FIX = ("Fork and join inside the step: `s.wait_stream(torch.cuda.current_stream())` before the block and "
        "`torch.cuda.current_stream().wait_stream(s)` after it.")


def _stream_of(item) -> str | None:
    """The stream a `with` item enters, as written (`self.stream` of `torch.cuda.stream(self.stream)`)."""
    call = item.context_expr
    if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr in _CONTEXTS \
            and call.args:
        return ast.unparse(call.args[0])
    return None


def _touches(call: ast.Call, stream: str, methods: tuple) -> bool:
    """`stream.<method>(...)` or any call handed the stream (`fork(self.stream)`, `cur.wait_stream(self.stream)`)."""
    f = call.func
    if isinstance(f, ast.Attribute) and f.attr in methods and ast.unparse(f.value) == stream:
        return True
    return any(ast.unparse(a) == stream for a in [*call.args, *(k.value for k in call.keywords)])


def _check(func, block: ast.With, stream: str) -> str | None:
    """'fork' or 'join' when that wait is missing around the block in its function, else None."""
    calls = [n for n in ast.walk(func) if isinstance(n, ast.Call)]
    before = [c for c in calls if c.lineno < block.lineno]
    after = [c for c in calls if c.lineno > (block.end_lineno or block.lineno)]
    if not any(_touches(c, stream, ("wait_stream", "wait_event")) for c in before):
        return "fork"
    if not any(_touches(c, stream, ("synchronize",)) or
               (isinstance(c.func, ast.Attribute) and c.func.attr == "wait_event") for c in after):
        return "join"
    return None


@register("unjoined-stream")
def streams_in_untaken_device_branches(ctx):
    """On a CPU scan: side-stream blocks without a fork or a join in device branches of code the step ran."""
    if ctx.cuda:
        return []
    out, seen = [], set()
    for file, name, caller, node, sts in untaken_sides(ctx):
        func = lookup.enclosing_function(file, node.lineno)
        for block in (n for st in sts for n in ast.walk(st) if isinstance(n, ast.With)):
            for stream in filter(None, map(_stream_of, block.items)):
                if (file, block.lineno) in seen or func is None:
                    continue
                seen.add((file, block.lineno))
                kind = _check(func, block, stream)
                if kind is None:
                    continue
                why = ("runs with no wait on the step's stream before it: under capture it is not part of the graph "
                       "and replay skips it" if kind == "fork" else
                       "is never waited on by the step's stream after it: capture fails (unjoined work), eager "
                       "reads race")
                out.append(ctx.finding(
                    "unjoined-stream", (file, block.lineno, name), f"stream {kind}", 0.0,
                    f"the side-stream block on `{stream}` sits in a branch guarded by `{ast.unparse(node.test)}` that "
                    f"this CPU scan did not take; on a GPU its work {why} (found in the source, not traced)",
                    fix=_FIX, caller=caller))
    return out
