"""unjoined-stream: an async collective (`async_op=True`) whose `Work` the step never waits for.

On NCCL an async collective runs on the process group's own stream, which first waits on the caller's stream
(a fork); `work.wait()` makes the caller's stream wait for it again (the join). Without the wait, the step's
stream reads the output with no dependency on the collective: a race in eager decode, and in a graph the read's
node has no edge from the collective's either. Measured on an H100 (torch 2.11, one NCCL rank), a capture with a
dropped handle did not fail: torch joins the group's stream by the end of the capture, but not before the read.
A synchronous collective waits inside torch.distributed itself, so only a handle the step drops, or keeps for a
later step, is left unjoined. Only calls written with `async_op=` (at the first frame outside torch) are read:
on NCCL torch waits a synchronous collective in C++, where no join is seen.

The trace notes each c10d op's Work (`work:<id>`) and each join the step's code makes (`dist` records of
audit.scan.patches.dist_hooks). A group's collectives run in order on its one stream, so a wait on one of them
joins every earlier collective of the same group too (bucketed reductions waiting only the last handle). A wait
on a Work no op of this step made (a handle from an earlier step, a coalesced batch's handle) is taken to join
everything issued before it.
"""

from __future__ import annotations

import ast

from audit.detectors import register
from audit.detectors.source import lookup
from audit.scan.patches.dist_hooks import KIND
from audit.scan.sources.ast_nodes import calls_at
from audit.scan.sources.user_code import is_torch_file

_FIX = ("keep the handle and call `work.wait()` before the result is read and before the step ends (or pass "
        "async_op=False); a handle carried into the next step cannot be captured")


def _group(r) -> str:
    return next((a for a in r.args if isinstance(a, str) and a.startswith("ProcessGroup")), "")


def _asked_async(r) -> bool:
    """The first frame outside torch that issued the collective passes `async_op=` something other than False."""
    frame = next(((c.co_filename, line) for c, line in reversed(r.stack) if not is_torch_file(c.co_filename)), None)
    t = lookup.tree(frame[0]) if frame else None
    return t is not None and any(k.arg == "async_op" and not (isinstance(k.value, ast.Constant) and not k.value.value)
                                 for c in calls_at(t, frame[1]) for k in c.keywords)


def _unjoined(recs: list) -> list:
    """The records of this step's collectives whose Work no later join covers."""
    issued: list = []  # [record, work note, group, joined]
    for r in recs:
        if r.kind == "aten" and not r.nested and r.note.startswith("work:") and r.stack:
            issued.append([r, r.note, _group(r), False])
        elif r.kind == KIND:
            at = next((k for k, e in enumerate(issued) if e[1] == r.note), None)
            for k, e in enumerate(issued):
                if at is None or (k <= at and e[2] == issued[at][2]):
                    e[3] = True
    return [e[0] for e in issued if not e[3] and _asked_async(e[0])]


@register("unjoined-stream")
def unwaited_collectives(ctx):
    """Async collectives whose Work is never waited in the step: an NCCL stream forked and never joined."""
    left = [r for s in range(len(ctx.steps)) for r in _unjoined(ctx.steps[s])]
    out = []
    for _, group in ctx.per_site(left).items():
        r = group[0]
        msg = (f"`{r.op}` ran with async_op=True and the step never waits for its Work: on NCCL it runs on the "
               "process group's stream, forked from the step's, and nothing orders the step's reads after it, in "
               "eager decode or in a graph (torch joins that stream only at the end of a capture)")
        out.append(ctx.finding("unjoined-stream", r, f"collective {r.op.split('.')[-1]}", len(group) / ctx.n_steps,
                               msg, fix=_FIX))
    return out
