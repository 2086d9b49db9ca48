"""Host data built and sent to the device in one expression: what the step reads of it later is the device copy.

Reference generate loops hand the position down as a tensor made on the spot:
`model.forward(tok[:, None], torch.LongTensor([cur_pos]).to(tok))`, and the attention reads it back
(`cur_pos = positions[-1].item() + 1`). On a CPU scan `.to(D)` hands back the very storage it got, so that read
looks like one of host data built in the step, which waits for nothing. But no name holds the tensor before the
move: the `.to(...)` (or `.cuda()`) is called on a temporary, so every later read of that storage is of the moved
copy, device memory on a GPU, and waits for the device. A tensor a name holds before the move
(`pos = torch.tensor([p]); d = pos.to(dev); pos.item()`) may still be read as it was, and stays host data.
"""

from __future__ import annotations

import ast

from audit.detectors.source import lookup
from audit.detectors.source.stored_back import MOVES



def _moves_temporary(filename: str, line: int) -> bool:
    """The line's `.to(...)` / `.cuda(...)` calls all act on a value no name holds (a call's result)."""
    func = lookup.enclosing_function(filename, line)
    if func is None:
        return False
    moves = [n for n in ast.walk(func) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and n.func.attr in MOVES and n.lineno <= line <= (n.end_lineno or n.lineno)]
    return bool(moves) and all(isinstance(n.func.value, ast.Call) for n in moves)


def read_of_moved_temporary(recs, r, sent: dict) -> bool:
    """(CPU scan) record `r` of step `recs` reads storage that an earlier `.to(D)` of the step sent to the device
    (`sent`: storage id -> index of the send, host/kept.sent_at) from a temporary: on a GPU it reads the copy."""
    if not r.inputs:
        return False
    i = sent.get(r.inputs[0].sid)
    if i is None or i >= r.index or not recs[i].stack:
        return False
    code, line = recs[i].stack[-1]
    return _moves_temporary(code.co_filename, line)
