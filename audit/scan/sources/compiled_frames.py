"""Source lines for code the step runs that Python frames do not show as its own file.

- A `torch.fx` GraphModule runs generated code (`<eval_with_key>.N from FILE:LINE in forward`). Its
  frames would be hidden and a hazard traced into the module (`s = x.abs().max().item()`) would land
  on the step's call of the module. Each generated line is one node; it is matched to the call,
  operator or attribute of the same kind, at the same rank, in the traced function's source (FILE,
  the def at LINE), so the site is the line the user wrote.
- A `torch.jit.script` function (or a scripted module's method, or a `torch.jit.trace`d one, whose nodes
  carry the Python stack of the trace: `FILE(LINE): forward`, first frame outside torch) runs in the TorchScript interpreter: no
  Python frame at all, so the ops inside it would land on the line that called it. While one runs
  (its `__call__` is wrapped during the audited steps), each op is matched to the graph node of the
  same aten name, at the same rank in this call, and the node's source range gives the line
  (`n = int(live.sum())`). A node that reads tensor data on the host without dispatching an op
  (`prim::tolist`: `slots.tolist()` in a script) is reported by the call's wrapper once the call returns, when
  its block ran (the function's own, or one whose aten ops ran): the dispatch mode never sees it.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import linecache
import re
import sys

import torch

from audit.scan.sources.ast_nodes import nodes_of
from audit.scan.sources.frame_source import tree
from audit.scan.sources.user_code import HIDDEN, frame_kind

__all__ = ["fx_site", "script_calls", "script_site"]
_HOST_PRIMS = frozenset({"prim::tolist"})  # a host read of tensor data that dispatches no op

_FX = re.compile(r"^<eval_with_key>\.\d+ from (.+):(\d+) in (\w+)$")
_RANGE = re.compile(r'File "(.+)", line (\d+)')
_TRACED = re.compile(r"^(.+)\((\d+)\): (\w+)$", re.M)
_READS = frozenset({"aten::Int", "aten::Float", "aten::Bool", "aten::item", "aten::ScalarImplicit",
                    "aten::IntImplicit", "aten::FloatImplicit", "aten::tolist"})


@functools.lru_cache(maxsize=256)
def _code(file: str, name: str, first: int):
    """A code object standing for a function of `file` (its name, first line): what a frame would be."""
    return compile("pass", file, "exec").replace(co_name=name, co_firstlineno=first)


# ------------------------------------------------------------------ torch.fx
def _key(node):
    """What kind of expression a node is, for matching generated code to the source it was traced from."""
    if isinstance(node, ast.Call):
        f = node.func
        return ("call", f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None))
    if isinstance(node, (ast.BinOp, ast.UnaryOp)):
        return ("op", type(node.op).__name__)
    if isinstance(node, ast.Compare) and len(node.ops) == 1:
        return ("op", type(node.ops[0]).__name__)
    if isinstance(node, ast.Subscript):
        return ("getitem",)
    if isinstance(node, ast.Attribute):
        return ("attr", node.attr)
    return None


def _post_order(node, out: list, func_of_call: bool = False) -> list:
    """The expressions under `node` in evaluation order (operands before what uses them); the callee
    of a call (`self.lin` in `self.lin(x)`) is part of the call, not an attribute read of its own."""
    for name, child in ast.iter_fields(node):
        kids = child if isinstance(child, list) else [child]
        for k in kids:
            if isinstance(k, ast.AST) and not isinstance(k, (ast.FunctionDef, ast.ClassDef, ast.Lambda)):
                _post_order(k, out, isinstance(node, ast.Call) and name == "func")
    if not func_of_call and (key := _key(node)) is not None:
        out.append((key, node.lineno))
    return out


@functools.lru_cache(maxsize=128)
def _traced_exprs(file: str, line: int, name: str) -> tuple:
    """(key, line) of the expressions of the function `name` defined at `line` of `file`, in order."""
    for fn in _defs(file):
        if fn.name == name and fn.lineno == line:
            out: list = []
            for stmt in fn.body:
                _post_order(stmt, out)
            return tuple(out)
    return ()


@functools.lru_cache(maxsize=128)
def _generated_keys(filename: str) -> tuple:
    """Key of each line of a GraphModule's generated forward (None where the line is no node)."""
    keys = [None]
    for text in linecache.getlines(filename):
        stmt = text.split(";")[0].strip()
        key = None
        with contextlib.suppress(SyntaxError):
            node = ast.parse(stmt).body[0] if stmt else None
            if isinstance(node, ast.Assign):
                key = _key(node.value)
        keys.append(key)
    return tuple(keys)


def fx_site(code, lineno: int):
    """(code, line) in the traced source for a frame of GraphModule-generated code, or None."""
    m = _FX.match(code.co_filename)
    if m is None:
        return None
    file, first, name = m.group(1), int(m.group(2)), m.group(3)
    keys = _generated_keys(code.co_filename)
    key = keys[lineno] if lineno < len(keys) else None
    line = first
    if key is not None:
        rank = sum(1 for k in keys[:lineno] if k == key)
        same = [ln for k, ln in _traced_exprs(file, first, name) if k == key]
        line = same[rank] if rank < len(same) else first
    return _code(file, name, first), line


# ------------------------------------------------------------------ torch.jit.script
def _script_nodes(fn) -> dict:
    """aten name -> [(file, line)] of a script function's graph nodes (nested blocks and inlined
    callees included), in graph order."""
    out: dict = {}

    def walk(block):
        for n in block.nodes():
            at, kind = _node_site(n)
            if at and kind:
                out.setdefault(kind, []).append(at)
            for b in n.blocks():
                walk(b)

    with contextlib.suppress(Exception):
        walk(fn.inlined_graph)
    return out


def _node_site(n) -> tuple:
    """(file, line, function) of a graph node's source (None without one), and the aten name the dispatcher reports
    for it (a scalar read under its dispatched name; None for a node that is no aten op)."""
    src = n.sourceRange() or ""
    m = _RANGE.search(src)
    at = (m.group(1), int(m.group(2)), None) if m else _traced_at(src)
    kind = ("aten::_local_scalar_dense" if n.kind() in _READS else n.kind()) if n.kind().startswith("aten::") else None
    return at, kind


def _traced_at(src: str):
    """(file, line, function) of a `torch.jit.trace`d node: its range is the Python stack at trace time,
    innermost first (`FILE(LINE): forward`), whose first frame outside torch, the audit and the stdlib is the line
    the user wrote."""
    for m in _TRACED.finditer(src):
        if frame_kind(m.group(1)) != HIDDEN:
            return m.group(1), int(m.group(2)), m.group(3)
    return None


def _script_reads(fn) -> tuple:
    """((file, line, name), argument index or None, {aten kind: [its ranks]} of its block or None for the
    function's own block) of each node in `_HOST_PRIMS`; ranks counted in `_script_nodes`' order."""
    out, seen, params = [], {}, []

    def walk(block, top):
        mine, reads = {}, []
        for n in block.nodes():
            at, kind = _node_site(n)
            if at and kind:
                mine.setdefault(kind, []).append(seen.get(kind, 0))
                seen[kind] = seen.get(kind, 0) + 1
            elif n.kind() in _HOST_PRIMS and (at := at or _unranged_at(n)):
                v = n.inputsAt(0)
                reads.append((at, next((i for i, p in enumerate(params) if p is v or p.debugName() == v.debugName()),
                                       None)))
            for b in n.blocks():
                walk(b, False)
        out.extend((at, i, None if top else mine) for at, i in reads)

    with contextlib.suppress(Exception):
        graph = fn.inlined_graph
        params[:] = list(graph.inputs())[1 if isinstance(fn, torch._C.ScriptMethod) else 0:]  # a method's self
        walk(graph.block(), True)
    return tuple(out)


def _unranged_at(node):
    """(file, line, None) of a host-read node TorchScript gives no source range (`prim::tolist`): the last
    `.tolist(` call, in the function holding its first use, at or above the line of that use."""
    for use in node.outputsAt(0).uses():
        if (m := _RANGE.search(use.user.sourceRange() or "")) is None:
            continue
        file, line = m.group(1), int(m.group(2))
        return file, max(_calls_above(file, line, node.kind().partition("::")[2]), default=line), None
    return None


def _calls_above(file: str, line: int, name: str) -> tuple:
    """Lines of the calls of method `name` in the innermost function of `file` around `line`, up to `line`."""
    fns = [f for f in _defs(file) if f.lineno <= line <= (f.end_lineno or f.lineno)]
    if not fns:
        return ()
    fn = max(fns, key=lambda f: f.lineno)
    return tuple(c.lineno for c in nodes_of(fn, ast.Call) if isinstance(c.func, ast.Attribute)
                 and c.func.attr == name and c.lineno <= line)


def _defs(file: str) -> tuple:
    """The function definitions of a file's source, in walk order."""
    t = tree(file)
    return nodes_of(t, (ast.FunctionDef, ast.AsyncFunctionDef)) if t is not None else ()


_GRAPH_VIEWS: dict = {}  # (id(function), reader) -> (function, view): a script's graph is fixed once scripted


def _read_once(fn, reader):
    """reader(fn), read once per script function (its graph is walked in full: not at every call of a step's
    loop); the function is held, so its id is not reused."""
    key = (id(fn), reader)
    ent = _GRAPH_VIEWS.get(key)
    if ent is None or ent[0] is not fn:
        if len(_GRAPH_VIEWS) > 512:
            _GRAPH_VIEWS.clear()
        ent = _GRAPH_VIEWS[key] = (fn, reader(fn))
    return ent[1]


def _ran_reads(entry, args: tuple) -> list:
    """(site, tensor or None) of the host-read nodes of a finished call whose block ran."""
    fn, ranks = entry[0], entry[2]
    out = []
    for (file, line, name), i, mine in _read_once(fn, _script_reads):
        if mine is None or any(k < ranks.get(kind, 0) for kind, ks in mine.items() for k in ks):
            arg = args[i] if i is not None and i < len(args) else None
            out.append((_site(fn, file, line, name), arg if isinstance(arg, torch.Tensor) else None))
    return out


def _site(fn, file: str, line: int, name):
    """(code, line) standing for line `line` of the scripted source."""
    orig = getattr(getattr(fn, "_torchdynamo_inline", None), "__code__", None)  # the Python function scripted
    return (orig if orig is not None and orig.co_filename == file else _code(file, name or fn.name, line)), line


class _Calls:
    """The script functions and methods running now, innermost last: [function, the code of the innermost
    visible frame that called it, ranks so far, its nodes (read on first use)]."""

    def __init__(self):
        self.active: list = []


CALLS = _Calls()


@contextlib.contextmanager
def script_calls(innermost, on_read=None):
    """Wraps `ScriptFunction.__call__` and `ScriptMethod.__call__` (a scripted module's forward, called
    through nn.Module's hidden frames) so the ops of a running script can be placed. innermost(frame): the
    code of the innermost frame a finding may name, from `frame` outwards. on_read(frame, site, tensor): a
    host read the call ran below the dispatcher (`_HOST_PRIMS`), `frame` the one that called the script."""
    classes = (torch._C.ScriptFunction, torch._C.ScriptMethod)
    origs = [cls.__call__ for cls in classes]

    def wrap(orig):
        def call(self, *args, **kwargs):
            entry = [self, innermost(sys._getframe(1)), {}, None]
            CALLS.active.append(entry)
            try:
                out = orig(self, *args, **kwargs)
            finally:
                CALLS.active.pop()
            for site, t in (_ran_reads(entry, args) if on_read is not None else ()):
                on_read(sys._getframe(1), site, t)
            return out
        return call

    for cls, orig in zip(classes, origs):
        cls.__call__ = wrap(orig)
    try:
        yield
    finally:
        for cls, orig in zip(classes, origs):
            cls.__call__ = orig
        CALLS.active.clear()


def script_site(stack: tuple, op: str):
    """(code, line) of the script node that ran aten op `op` ("aten.slice"), when the innermost frame of
    `stack` is the one that called the running script; else None."""
    if not CALLS.active or not stack:
        return None
    entry = CALLS.active[-1]
    fn, caller, ranks = entry[0], entry[1], entry[2]
    if stack[-1][0] is not caller:  # a Python function the script called (@torch.jit.ignore) is running
        return None
    if entry[3] is None:
        entry[3] = _read_once(fn, _script_nodes)
    kind = "aten::" + op.partition(".")[2]
    nodes = entry[3].get(kind)
    if not nodes:
        return None
    rank = ranks.get(kind, 0)
    ranks[kind] = rank + 1
    file, line, name = nodes[min(rank, len(nodes) - 1)]  # name: a traced node's own function
    return _site(fn, file, line, name)


@contextlib.contextmanager
def unfused_scripts():
    """TorchScript's fusers off for the scan (on a GPU they run a scripted chain of pointwise ops as one kernel
    the tracer never sees, whose outputs then look like tensors from outside the step); restored after.
    (`torch.jit.fuser("none")` does the same but warns that nvfuser is gone.)"""
    C = torch._C
    saved = (C._jit_can_fuse_on_cpu(), C._jit_can_fuse_on_gpu(), C._jit_texpr_fuser_enabled(), C._jit_llga_enabled())
    C._jit_override_can_fuse_on_cpu(False)
    C._jit_override_can_fuse_on_gpu(False)
    C._jit_set_texpr_fuser_enabled(False)
    C._jit_set_llga_enabled(False)
    try:
        yield
    finally:
        C._jit_override_can_fuse_on_cpu(saved[0])
        C._jit_override_can_fuse_on_gpu(saved[1])
        C._jit_set_texpr_fuser_enabled(saved[2])
        C._jit_set_llga_enabled(saved[3])

