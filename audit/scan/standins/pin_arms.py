"""Host memory pinned on the other arm of a platform probe: `t.pin_memory() if torch.cuda.is_available() else t`.

Offloading code pins its host copies only where a GPU is there, so it also runs on a laptop:
`self.host = w.to("cpu").pin_memory() if pin else w.to("cpu")`, `[torch.randn(d, d).pin_memory() if pin else
torch.randn(d, d) for _ in layers]`, or a helper `def _pin(t): return t.pin_memory() if torch.cuda.is_available()
else t` around the `.cpu()` copy. A CPU scan takes the arm that does not pin, and the copy rules would call the
buffer pageable; a GPU takes the other arm. While the target is built (audit.scan.standins.pinned's stand-in), a tensor
made on a line whose conditional expression pins in one arm under a probe (pin_flags' test: a call, or a device
test that holds on a GPU) is noted as asked to be pinned; so is one passed to a function of the target's files
whose every `return` is such an expression.
"""

from __future__ import annotations

import ast
import sys

from audit.scan.sources.ast_nodes import calls_at, nodes_of
from audit.scan.sources.frame_source import function_of, tree
from audit.scan.standins import pin_flags

__all__ = ["pinned_arm"]

_SEEN: dict = {}  # (file, line, code name) -> bool; the probe's origin is the same at every run of a line


def _pins(expr) -> bool:
    """Does this expression pin what it makes (`.pin_memory()`, `pin_memory=True`)?"""
    for call in nodes_of(expr, ast.Call):
        if isinstance(call.func, ast.Attribute) and call.func.attr == "pin_memory":
            return True
        if any(k.arg == "pin_memory" and isinstance(k.value, ast.Constant) and k.value.value is True
               for k in call.keywords):
            return True
    return False


def _probe_arm(expr, frame, module=None) -> bool:
    """An IfExp whose test is a probe and one of whose arms pins, the other not (`module`: the file a helper's
    global flag is looked up in)."""
    return isinstance(expr, ast.IfExp) and _pins(expr.body) != _pins(expr.orelse) \
        and pin_flags.origin(expr.test, frame, 4, module) == "probe"


def _line_pins(frame) -> bool:
    t = tree(frame.f_code.co_filename)
    if t is None:
        return False
    line = frame.f_lineno
    if any(_probe_arm(n, frame) for n in nodes_of(t, ast.IfExp) if n.lineno <= line <= (n.end_lineno or n.lineno)):
        return True
    for call in calls_at(t, line):  # `_pin(w.cpu())`: a helper that pins under a probe
        fn = frame.f_globals.get(call.func.id) if isinstance(call.func, ast.Name) else None
        node = function_of(fn.__code__) if hasattr(fn, "__code__") else None
        rets = [r.value for r in nodes_of(node, ast.Return)] if node is not None else []
        if rets and all(_probe_arm(r, None, fn.__code__.co_filename) for r in rets):
            return True
    return False


def pinned_arm() -> bool:
    """Called while the target is built, for a tensor just made: does the target's line that made it pin it on a
    GPU's arm of a probe?"""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(pin_flags.SKIP):
        frame = frame.f_back
    if frame is None:
        return False
    key = (frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
    hit = _SEEN.get(key)
    if hit is None:
        hit = _SEEN[key] = _line_pins(frame)
    return hit
