"""Inputs that prepare() rebinds to a device copy of a host buffer the object keeps: new storage per step on a GPU.

A runner that stages on the host correctly (a persistent, often pinned, buffer refilled in place) can still
upload it by rebinding: `self.slots = self.slots_cpu.to(self.device, non_blocking=True)` in prepare(). On a
GPU every call makes a new device tensor, so a captured step keeps reading the copy the capture step made.
On a CPU scan the move returns the host buffer itself, the same storage every step, and the trace shows
nothing; the source does. Read from prepare() and the methods it calls on `self` or on an object the target
holds (a metadata builder): an attribute assigned a move towards a device (`.to(D)` whose device is no CPU
literal, `.cuda()`) of an attribute the class makes with a torch factory in host memory (naming no device, or
pinned), also passed by keyword to the call that builds the stored object (a metadata dataclass,
`dataclasses.replace(self.meta, seq_lens=...)`: the field `meta.seq_lens`). A move done once, under
`if i == 0:` in prepare(), makes one tensor before capture: no finding.
"""

from __future__ import annotations

import ast
import inspect

from audit.detectors.host.attr_memory import host_factory_attr, host_memory
from audit.detectors.source import scopes
from audit.scan.sources.ast_nodes import attr_chain, nodes_of
from audit.scan.sources.frame_source import tree


def _function(fn):
    """(filename, parsed file, FunctionDef) of a Python function or method, found by its code object."""
    code = getattr(inspect.unwrap(getattr(fn, "__func__", fn)), "__code__", None)
    t = tree(code.co_filename) if code is not None else None
    for n in nodes_of(t, (ast.FunctionDef, ast.AsyncFunctionDef)) if t is not None else ():
        if n.name == code.co_name and code.co_firstlineno in [n.lineno] + [d.lineno for d in n.decorator_list]:
            return code.co_filename, t, n
    return None


def _methods(obj, name: str = "prepare", prefix: str = "", depth: int = 2, follow=None) -> list:
    """(file, tree, FunctionDef, path prefix) of prepare() and the methods it calls on `self` or on an object the
    target holds (`self._upload()`, `self.builder.stage(...)`: a metadata builder's fields are `builder.<x>`),
    followed `depth` calls down, into files `follow(filename)` allows (not torch's own `self.model.to(D)`)."""
    meth = getattr(obj, name, None)
    found = _function(meth) if callable(meth) else None
    if found is None or (prefix and follow is not None and not follow(found[0])):
        return []
    out = [found + (prefix,)]
    once = _once(found[2]) if name == "prepare" else set()
    for call in nodes_of(found[2], ast.Call) if depth > 0 else ():
        chain = attr_chain(call.func)
        if id(call) in once or not chain or chain[0] != "self" or len(chain) < 2 or chain[1:] == [name]:
            continue
        owner = obj
        for attr in chain[1:-1]:
            owner = getattr(owner, attr, None)
        if owner is not None and not isinstance(owner, type):
            sub = prefix + "".join(f"{a}." for a in chain[1:-1])
            out += [m for m in _methods(owner, chain[-1], sub, depth - 1, follow) if m[:3] not in [o[:3] for o in out]]
    return out


def _base(expr):
    """The `self.<attr>` chain a moved expression starts from (through slices: `self.buf_cpu[:n]`)."""
    while isinstance(expr, ast.Subscript):
        expr = expr.value
    chain = attr_chain(expr)
    return chain if chain and chain[0] == "self" and len(chain) >= 2 else None


def rebinds(obj, follow=None) -> list[tuple[str, str, int, str, bool]]:
    """(attribute path, file, line, source of the move, keyed) for each `self.<path> = self.<host buffer>.to(D)`
    in prepare() or a method it calls; keyed: the store is into an entry, `self.<path>[k] = self.<bufs>[k].to(D)`
    (a dict of host buffers by name), so each entry of `<path>` is one."""
    out = []
    for filename, t, fn, prefix in _methods(obj, follow=follow):
        once = _once(fn) if fn.name == "prepare" else set()
        for node in nodes_of(fn, ast.Assign):
            if id(node) in once:
                continue
            store = node.targets[0] if len(node.targets) == 1 else None
            keyed = isinstance(store, ast.Subscript)
            target = attr_chain(store.value if keyed else store) if store is not None else None
            if not target or target[0] != "self" or len(target) < 2:
                continue
            for field, value in _stored(t, node.value):
                for move in _arms(value):
                    base = _base(move.func.value) if scopes.device_move(t, move) else None
                    if base is not None and (host_factory_attr(filename, base[-1]) is not None
                                             or keyed and _host_entries(filename, base[-1])):
                        path = prefix + ".".join(target[1:] + field)
                        out.append((path, filename, node.lineno, ast.unparse(move), keyed))
                        break  # (else: not a host buffer the class makes, always)
    return out


def _stored(t, value) -> list:
    """(field path, expression) for what an assignment stores: the value itself, and when it is a call building
    an object (a metadata dataclass, `dataclasses.replace(self.meta, seq_lens=...)`), each keyword as that
    object's field."""
    out = [([], value)]
    if isinstance(value, ast.Call) and not scopes.device_move(t, value):
        out += [([k.arg], k.value) for k in value.keywords if k.arg]
    return out


def _arms(value) -> list:
    """The values an assignment may store: both arms of a conditional expression (`x.cuda() if on_gpu else x`:
    the GPU takes the move)."""
    return _arms(value.body) + _arms(value.orelse) if isinstance(value, ast.IfExp) else [value]


def _once(fn) -> set:
    """ids of the statements prepare() runs on one step only: under `if i == 0:` / `if not i:` (i its step)."""
    args = [a.arg for a in fn.args.args]
    step = args[1] if len(args) > 1 else None
    out = set()
    for node in nodes_of(fn, ast.If):
        test = node.test
        first = (isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and isinstance(test.operand, ast.Name)
                 and test.operand.id == step) or (
            isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == step
            and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq) and isinstance(test.comparators[0], ast.Constant))
        if first:
            out |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return out


def _host_entries(filename: str, attr: str) -> bool:
    """The class makes `self.<attr>` a dict whose every value is a host torch factory (`{"ids": torch.zeros(n)}`,
    or a comprehension of one), and assigns it nothing else."""
    t = tree(filename)
    values = []
    for node in nodes_of(t, ast.Assign) if t is not None else ():
        if any(isinstance(x, ast.Attribute) and x.attr == attr for x in node.targets):
            v = node.value
            values += v.values if isinstance(v, ast.Dict) else [v.value] if isinstance(v, ast.DictComp) else [None]
    return bool(values) and all(v is not None and host_memory(filename, v) is not None for v in values)
