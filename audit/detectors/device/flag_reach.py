"""Whether a device branch a CPU scan did not take can run on a GPU, by the plain flags on the way to it.

`if self.timing and x.is_cuda: torch.cuda.synchronize()`, or `if x.is_cuda:` nested in `if self.debug:`:
the device test decides nothing while `self.timing` / `self.debug` is false, on any device. The scan read
those flags in the running frames (audit/scan/sources/branch_flags.py); a wait is out of reach when a flag that
must hold for it was seen in every audited step with the other value. A flag whose assignments call
something (`self.gpu_ok = _probe()`, a platform probe answering differently on the CPU) or test the device
is not trusted to hold the same value on the GPU, nor is one the scan never read.
"""

from __future__ import annotations

import ast

from audit.detectors.source import lookup, scopes
from audit.scan.sources.branch_flags import flag_exprs

__all__ = ["blocking_flag", "known", "seen"]


def _needs(test, want: bool) -> list:
    """(expr, truth) that must hold for `test` to be `want`: the test, and the operands of an `and`
    that must all hold (or of an `or` that must all fail)."""
    out = [(test, want)]
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And if want else ast.Or):
        out += [(v, want) for v in test.values]
    return out


def _flag(e):
    """The name or attribute chain a flag read reads (`not self.x` -> self.x, `mode == "dbg"` -> mode)."""
    while isinstance(e, ast.UnaryOp):
        e = e.operand
    if isinstance(e, ast.Compare):
        e = e.comparators[0] if isinstance(e.left, ast.Constant) else e.left
    return e


# calls that read configuration, the same on any machine of a deployment (`os.environ.get("DEBUG") == "1"`)
_CONFIG_CALLS = {"os.environ.get", "environ.get", "os.getenv", "getenv", "int", "bool", "str", "float"}
_STR_METHODS = {"lower", "upper", "strip", "casefold"}


def _config_call(n: ast.Call) -> bool:
    f = n.func
    return ast.unparse(f) in _CONFIG_CALLS or (isinstance(f, ast.Attribute) and f.attr in _STR_METHODS)


def _trusted(tree, e, line: int, is_device) -> bool:
    """A flag whose value here is its value on a GPU: no device test, and no call among its assignments
    but configuration reads (any other call may be a platform probe: `self.gpu_ok = _probe()`)."""
    if is_device(e):
        return False
    vals = scopes.values(tree, _flag(e), line)
    return not any(isinstance(n, ast.Call) and not _config_call(n) for v, _ in vals or () for n in ast.walk(v))


def seen(file: str, line: int, flags: dict, e) -> bool | None:
    """The one truth value the plain flag `e` of the test on `line` held in every audited step, trusted
    or not (which side a CPU scan took); None when not read or both."""
    if not any(e is f for f in flag_exprs(e)):
        return None  # not a plain flag: the scan did not read it
    held = flags.get((file, line, ast.unparse(e)))
    return next(iter(held)) if held and len(held) == 1 else None


def known(tree, file: str, line: int, flags: dict, is_device):
    """expr -> the one truth value a plain, trusted flag of the `if` on `line` held in every audited step
    the scan read it (None: not read, both values, or not trusted)."""
    def value(e):
        held = seen(file, line, flags, e)
        return held if held is not None and _trusted(tree, e, line, is_device) else None
    return value


def blocking_flag(tree, func, node, side: str, file: str, flags: dict, is_device) -> str | None:
    """The flag that kept `side` of the device-guarded `node` out of reach in every audited step, else None."""
    needs = []
    for anc, field in lookup.chain(func, node.lineno):  # the `if`s around `node` (its own: part "test")
        if isinstance(anc, ast.If) and field in ("body", "orelse"):
            needs += [(anc.lineno, e, want) for e, want in _needs(anc.test, field == "body")]
    needs += [(node.lineno, e, want) for e, want in _needs(node.test, side == "body")[1:]]
    for line, e, want in needs:
        held = known(tree, file, line, flags, is_device)(e)
        if held is not None and held != want:
            return ast.unparse(e)
    return None
