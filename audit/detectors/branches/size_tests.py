"""A branch decided by tensor sizes alone: one path per shape, downstream of the dynamic shape, not a data branch.

timm's `resample_abs_pos_embed` returns the position table untouched when the wanted grid is the table's own
(`if num_new_tokens == num_pos_tokens: ... return posemb`) and interpolates it otherwise. Under
`dynamic_img_size` the grid is read off the image (`B, H, W, C = x.shape`), so a stream whose frames sometimes have
the model's native size runs fewer ops in those steps. No tensor value decided: the varying shape did, and it is
reported where it starts (dynamic-shape); a graph per shape bucket holds one path each, and a fixed shape takes
one side always. So the fork is not reported when the two steps read a tensor from outside the step with other
shapes (a size that came in with the inputs) and made no size from data (a `nonzero`, a count read back: an MoE
step's `if idx.numel() == 0:` stays a data branch beside a KV cache that grows) and the test reads sizes (`.shape`, `.size()`, `len()`, `.numel()`) and otherwise only constants and
attributes that neither the step nor prepare() changed: through locals the function binds before the test, and
through parameters, followed to the argument the caller passed (three calls up). The test's line must read no
tensor's value (`if x.shape[0] > 1 and flag_t:` reads `flag_t` on the host, a host-sync there). A counter mixed in
(`self.pos + t > cache.shape[1]`) keeps the branch a finding (branches/counter_tests.py runs it forward).
"""

from __future__ import annotations

import ast

from audit.detectors.source.lookup import enclosing_function, tree
from audit.detectors.sized_loops import SIZED_BY_DATA
from audit.detectors.tensors import read_sizes
from audit.scan.sources.ast_nodes import all_nodes

__all__ = ["decided_by_sizes"]

_DEPTH = 3


def decided_by_sizes(ctx, where, rec, s0: int, s1: int) -> bool:
    """The branch at `where` ((file, line, function)), which let `rec` run in one of steps `s0` and `s1`, tests
    sizes only, and the two steps read inputs of other shapes."""
    file, line, fn = where
    test = _test_at(file, line)
    if test is None or not _inputs_vary(ctx, s0, s1) or _reads_value_at(ctx, file, line) \
            or _data_sized(ctx, s0) or _data_sized(ctx, s1):
        return False
    k = next((i for i in range(len(rec.stack) - 1, -1, -1)
              if rec.stack[i][0].co_filename == file and rec.stack[i][0].co_name == fn), None)
    if k is None:
        return False
    callers = [(c.co_filename, ln, c.co_name) for c, ln in reversed(rec.stack[:k])]
    got = _sized(test, file, line, fn, callers, read_sizes.counter_attrs(ctx) | _changed_attrs(ctx), 0)
    return bool(got)


def _changed_attrs(ctx) -> set:
    """Attributes whose value the step or prepare() changed, of any type (a grid tuple `self.grid` set per step is
    a host value, not configuration)."""
    changes = [c for per_step in (*ctx.trace.changes, *getattr(ctx.trace, "staged", ())) for c in per_step]
    return {c.attr.rsplit(".", 1)[-1] for c in changes} - read_sizes._META


def _test_at(file: str, line: int):
    t = tree(file)
    for n in all_nodes(t) if t is not None else ():
        if isinstance(n, (ast.If, ast.While, ast.IfExp)) and n.lineno == line:
            return n.test
    return None


def _inputs_vary(ctx, s0: int, s1: int) -> bool:
    """The two steps read a tensor from outside the step with other shapes at the same call (an image of another
    size, a cache the steps grow): the sizes came in with the inputs, not from data the step computed on (a
    `nonzero` picking the tokens of an expert, whose `if idx.numel() == 0: continue` is a data branch)."""
    a, b = ctx.sites(s0), ctx.sites(s1)
    for key, r in a.items():
        u = b.get(key)
        if u is None:
            continue
        for j, (m, n) in enumerate(zip(r.inputs, u.inputs)):
            if tuple(m.shape) != tuple(n.shape) and j < min(len(r.in_step), len(u.in_step)) \
                    and not r.in_step[j] and not u.in_step[j]:
                return True
    return False


_DATA_SIZED = SIZED_BY_DATA | {"aten.bincount", "aten.repeat_interleave", "aten._local_scalar_dense", "aten.item"}


def _data_sized(ctx, step: int) -> bool:
    """The step made a size from data (a `nonzero` picking an expert's rows, a count read back with `.item()`):
    the tested size may be that one, whatever else came in with the inputs (a KV cache that grows), so the branch
    stays a data branch."""
    return any(r.op in _DATA_SIZED for r in ctx.steps[step] if r.kind == "aten")


def _reads_value_at(ctx, file: str, line: int) -> bool:
    """A host read (`bool(t)`, `.item()`) ran at the line in some complete step."""
    return any(r.kind != "aten" and r.frame is not None and r.frame[:2] == (file, line)
               for s in ctx.complete for r in ctx.ops(s))


def _names(expr) -> tuple[set, bool]:
    """Names the expression loads outside its size reads, and whether it calls a method or module function that
    is not a size read (`x.sum()`, `torch.any(m)`): a value, not a size."""
    names, valued, todo = set(), False, [expr]
    while todo:
        n = todo.pop()
        if read_sizes._is_size_read(n):
            continue
        if isinstance(n, ast.Call):
            f = n.func
            if isinstance(f, ast.Attribute) and not (isinstance(f.value, ast.Name)
                                                     and f.value.id in read_sizes._ARITH_MODULES):
                valued = True
            todo += list(n.args) + [k.value for k in n.keywords]
            continue
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            names.add(n.id)
        todo += list(ast.iter_child_nodes(n))
    return names, valued


def _rebound(func, name: str) -> bool:
    """`name` is bound by a loop, `+=`, a walrus or an annotated assignment: not followed here."""
    for n in ast.walk(func):
        targets = [n.target] if isinstance(n, (ast.For, ast.AugAssign, ast.AnnAssign, ast.NamedExpr)) else []
        if any(isinstance(x, ast.Name) and x.id == name for t in targets for x in ast.walk(t)):
            return True
    return False


def _sized(expr, file, line, fn, callers, counters, depth):
    """None when `expr` may read more than sizes and constants; else whether a size read was met."""
    if expr is None or read_sizes._attrs_read(expr) & counters:
        return None
    names, valued = _names(expr)
    if valued:
        return None
    found = read_sizes._reads(expr)
    func = enclosing_function(file, line)
    params = read_sizes._params(func) if func is not None else set()
    for name in names:
        bound = read_sizes._bound(func, {name}, line) if func is not None else []
        if func is not None and _rebound(func, name):
            return None
        if bound:
            for v in bound:
                got = None if read_sizes._tensor_made(v) else _sized(v, file, v.lineno, fn, callers, counters, depth)
                if got is None:
                    return None
                found |= got
        elif name in params:
            got = _passed(name, func, fn, callers, counters, depth)
            if got is None:
                return None
            found |= got
    return found


def _passed(name, func, fn, callers, counters, depth):
    """Follow parameter `name` of `fn` to the argument its caller's statement passed."""
    if depth >= _DEPTH or not callers:
        return None
    cfile, cline, cfn = callers[0]
    st = read_sizes._statement(cfile, cline)
    if st is None:
        return None
    arg = _argument(st, fn, func, name)
    return _sized(arg if arg is not None else st, cfile, cline, cfn, callers[1:], counters, depth + 1)


def _argument(st, fn, func, name):
    """The expression the call of `fn` in statement `st` passes for parameter `name`, or None."""
    a = func.args
    pos = [x.arg for x in a.posonlyargs + a.args]
    default = None
    for c in (n for n in ast.walk(st) if isinstance(n, ast.Call)):
        callee = c.func.attr if isinstance(c.func, ast.Attribute) else getattr(c.func, "id", None)
        if callee != fn:
            continue
        for k in c.keywords:
            if k.arg == name:
                return k.value
        shift = 1 if isinstance(c.func, ast.Attribute) and pos[:1] in (["self"], ["cls"]) else 0
        i = pos.index(name) - shift if name in pos else -1
        if 0 <= i < len(c.args) and not any(isinstance(x, ast.Starred) for x in c.args[:i + 1]):
            return c.args[i]
        default = ast.Constant(value=None)  # not passed: the default, a constant in the signature
    return default
