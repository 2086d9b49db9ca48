"""A tensor attribute made on the device a constructor is given, the CPU when the target does not give one.

Library classes often take the device as a parameter that defaults to the CPU: transformers'
`SuppressTokensLogitsProcessor(suppress_tokens, device="cpu")` keeps `self.suppress_tokens =
torch.tensor(list(suppress_tokens), device=device)` and sends it with `.to(scores.device)` on every call. Built
as `SuppressTokensLogitsProcessor([eos, 0])`, the tensor lives in pageable host memory on a GPU too, and that
`.to()` is a copy from pageable memory inside the step; built with `device=device`, it is a no-op. A CPU scan
cannot tell the two apart at run time (every tensor is on the CPU), and the factory's source alone names only a
parameter. The target's constructions of the class decide: when every one of them in the target's own files
leaves the parameter out (neither by keyword nor by position, no `*args` / `**kwargs`), its CPU default made
the tensor.
"""

from __future__ import annotations

import ast
import functools

from audit.detectors.source.lookup import tree
from audit.scan.sources.ast_nodes import all_nodes

__all__ = ["defaulted_to_cpu"]

_FACTORIES = ("tensor", "as_tensor", "zeros", "ones", "empty", "full", "arange", "randn", "rand")


def _names_cpu(node) -> bool:
    """A default that is the CPU: `"cpu"` or `torch.device("cpu")`."""
    if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "device" and node.args:
        node = node.args[0]
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.split(":")[0] == "cpu"


def _defaulted_param(fn, call) -> tuple[str, int] | None:
    """(name, position after self) of the parameter `call` passes as `device=`, when it has a CPU default."""
    dev = next((k.value for k in call.keywords if k.arg == "device"), None)
    if not isinstance(dev, ast.Name):
        return None
    pos = fn.args.posonlyargs + fn.args.args
    defaults = dict(zip([p.arg for p in pos[len(pos) - len(fn.args.defaults):]], fn.args.defaults))
    defaults.update({p.arg: d for p, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults) if d is not None})
    if dev.id not in defaults or not _names_cpu(defaults[dev.id]):
        return None
    names = [p.arg for p in pos]
    index = names.index(dev.id) - 1 if dev.id in names else 10**6  # keyword-only: never by position
    return dev.id, index


def _made_with(filename: str, span, attr: str) -> tuple | None:
    return _made_in(tree(filename), span, attr)


@functools.lru_cache(maxsize=4096)
def _made_in(t, span, attr: str) -> tuple | None:  # keyed by the parsed tree: a file edited on disk is read again
    """The CPU-defaulted device parameters of the `__init__` assignments `self.<attr> = torch.<factory>(...,
    device=<param>)` in the class's span; None when any assignment of the attribute there is anything else
    (another method moving it to a device, `self.t = self.t.to(x.device)`, decides otherwise)."""
    out = []
    for fn in all_nodes(t) if t is not None else ():
        if not (isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and span[0] <= fn.lineno <= span[1]):
            continue
        for node in ast.walk(fn):
            if not isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) or not any(
                    isinstance(x, ast.Attribute) and x.attr == attr and getattr(x.value, "id", "") == "self"
                    for x in (node.targets if isinstance(node, ast.Assign) else [node.target])):
                continue
            call = node.value
            ok = fn.name == "__init__" and isinstance(node, ast.Assign) and isinstance(call, ast.Call) \
                and isinstance(call.func, ast.Attribute) and call.func.attr in _FACTORIES \
                and getattr(call.func.value, "id", "") == "torch"
            param = _defaulted_param(fn, call) if ok else None
            if param is None:
                return None
            out.append(param)
    return tuple(out)


def _passes(call: ast.Call, name: str, index: int) -> bool:
    if any(k.arg in (name, None) for k in call.keywords) or any(isinstance(a, ast.Starred) for a in call.args):
        return True
    return len(call.args) > index


def defaulted_to_cpu(ctx, obj, attr: str, spans) -> bool:
    """The class of `obj` makes `attr` on a device parameter defaulting to the CPU, and every construction of
    the class in the target's own files leaves that parameter out."""
    made = [_made_with(f, span, attr) for f, span in spans]
    params = [p for m in made for p in m or ()]
    if not params or any(m is None for m in made):
        return False
    cls = type(obj).__name__
    calls = []
    for file in ctx.own_files():
        t = tree(file)
        calls += [n for n in all_nodes(t) if isinstance(n, ast.Call)
                  and getattr(n.func, "id", getattr(n.func, "attr", None)) == cls] if t is not None else []
    return bool(calls) and not any(_passes(c, name, index) for c in calls for name, index in params)
