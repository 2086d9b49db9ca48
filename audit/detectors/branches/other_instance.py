"""One step ran a module call the other did not, and went on with the same code on another instance.

An expert loop over the experts the data picked (`for e in active.tolist(): out += self.experts[e](x)`)
runs expert 1 then expert 2 in one step and only expert 2 in the other. The alignment then shows one
side's extra ops (expert 1's forward) with the other side going on at the very same lines on another
module (expert 2's forward): no branch sits around the extra ops, inside the expert, to name. The
decision is the caller's, as when both steps ran the same lines on different experts: the statement that
chose the instance there (the loop over the picked ids, or a guard in it), not the expert's first line.
"""

from __future__ import annotations

from audit.detectors.source import lookup


def same_lines(x, nxt) -> bool:
    """Both records at the same lines of the same code, on different module instances."""
    return x.module != nxt.module and len(x.stack) == len(nxt.stack) and all(
        fx[0] is fn[0] and fx[1] == fn[1] for fx, fn in zip(x.stack, nxt.stack))


def chose_instance(frame):
    """(file, line, function) of the statement in the caller's frame that chose the instance, or None."""
    if frame is None:
        return None
    code, line = frame
    found = lookup.chooser(code.co_filename, line) or lookup.picked_by(code.co_filename, line)
    return (code.co_filename, found, code.co_name) if found else None
