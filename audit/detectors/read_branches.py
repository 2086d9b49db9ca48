"""Branches on a value the step read back from the device, seen from the source.

`word = tok.id_to_token(int(self.next[0]))` then `if word in self.stops: self.finished.fill_(True)`: the read
is host-sync's finding, but the `if` two lines down is a second hazard that outlives any fix of the read
alone. Its side is decided by the data of the step a graph captured, and every replay runs that side. When
the audited steps happen to take the same side (the stop word never came), the op sequences agree and the
trace shows no fork; the source does. For each host read the step made (host_sync.read_records), the names its
statement binds (`n = int(t)`, `a, b = t.tolist()`, `for v in t.tolist():`; of a loop over `zip`/`enumerate`,
only the names paired with the read) and those later bound from them in the same function (`word = vocab[n]`)
are followed to the tests that read them: an `if`, `elif`, `while`,
a conditional expression, or `range(n)` that sets a loop's trip count; also into a function of the same file they
are passed to (`self.check_stop(tok)`, then `if tok in self.stops:`), two calls down. A test on the same line as its read
(`if t.item() > 0:`) is left to host-sync (one place to act); a test in the `elif`/`else` of the `if` whose body
read the value never sees it, and a type test (`isinstance(v, list)`) reads the shape, not the data; so is a check whose body only raises, a read
skipped while capturing, and a branch whose side the audited steps already took both ways (the traced rule,
control.py, names it).
"""

from __future__ import annotations

import ast

from audit.detectors import register
from audit.detectors.device import capture_guards
from audit.detectors.host_sync import read_records
from audit.detectors.source import lookup

# the host reads whose Python value the code goes on to use (not a wait such as synchronize())
_VALUE_READS = ("Tensor.item", "Tensor.tolist", "Tensor.__bool__", "Tensor.__int__", "Tensor.__float__",
                "Tensor.__index__", "Tensor.numpy", "Tensor.cpu")


def _statement(func, line: int):
    """The innermost statement of `func` that holds `line` (not a nested function's)."""
    best = None
    for n in ast.walk(func):
        if isinstance(n, ast.stmt) and n is not func and n.lineno <= line <= (n.end_lineno or n.lineno):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                return None
            if best is None or n.lineno >= best.lineno:
                best = n
    return best


def _stored(target) -> set[str]:
    """The plain names an assignment target binds (`a`, `a, (b, *c)`), not the objects it stores into."""
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, (ast.Tuple, ast.List)):
        return {n for e in target.elts for n in _stored(e)}
    if isinstance(target, ast.Starred):
        return _stored(target.value)
    return set()


def _bound(st, line: int) -> set[str]:
    """The names the statement holding the read binds from it: assignment targets, or a `for` loop's
    variables when the read is in its iterable."""
    targets = []
    if isinstance(st, ast.Assign):
        targets = st.targets
    elif isinstance(st, (ast.AnnAssign, ast.AugAssign)) and st.value is not None:
        targets = [st.target]
    elif isinstance(st, (ast.For, ast.AsyncFor)) and st.iter.lineno <= line <= (st.iter.end_lineno or line):
        return _paired(st.target, st.iter)
    return {n for t in targets for n in _stored(t)}


_READ_ATTRS = {"item", "tolist", "numpy", "cpu"}
_READ_CASTS = {"int", "float", "bool"}


def _reads_back(expr) -> bool:
    """`expr` holds a call that reads a tensor's value to the host (`t.tolist()`, `int(t)`)."""
    return any(isinstance(n, ast.Call) and ((isinstance(n.func, ast.Attribute) and n.func.attr in _READ_ATTRS)
                                            or (isinstance(n.func, ast.Name) and n.func.id in _READ_CASTS))
               for n in ast.walk(expr))


def _paired(target, it) -> set[str]:
    """The names of a `for` target that take the values read back: `zip` pairs each name with one iterable, so
    `for seq, tok in zip(self.seqs, ids.tolist()):` binds only `tok` to the read (`seq` is the host's own
    object), and `enumerate` binds its index to none. Where no one iterable shows the read, every name."""
    if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id in ("zip", "enumerate") \
            and isinstance(target, (ast.Tuple, ast.List)) and not it.keywords \
            and not any(isinstance(x, ast.Starred) for x in [*it.args, *target.elts]):
        sources = list(it.args) if it.func.id == "zip" else [None, *it.args[:1]]
        picked = [(t, src) for t, src in zip(target.elts, sources) if src is not None and _reads_back(src)]
        if len(sources) == len(target.elts) and picked:
            return {n for t, src in picked for n in _paired(t, src)}
    return _stored(target)


_SHAPE_ATTRS = {"shape", "ndim", "dtype", "device", "is_cuda", "layout"}
_SHAPE_CALLS = {"numel", "size", "dim"}
_TYPE_CALLS = {"len", "isinstance", "type"}  # what the read's shape and dtype fix: `isinstance(v, list)` after tolist()


def _reads(expr, names: set[str], bounds: bool = True) -> bool:
    """`expr` reads the value of one of `names`, not only its shape (`len(ids)`, `a.shape`, `a.numel()`: fixed
    by the tensor's size, which a capture fixes too) or presence (`a is None`); with `bounds` False, not as a
    slice bound either (`rows[:, :k]` holds the container's values, cut to a size)."""
    shape_only = set()
    for n in ast.walk(expr):
        if not bounds and isinstance(n, ast.Slice):
            shape_only |= {id(x) for x in ast.walk(n)}
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.attr in _SHAPE_ATTRS | _SHAPE_CALLS:
            shape_only.add(id(n.value))
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in _TYPE_CALLS and n.args:
            shape_only.add(id(n.args[0]))
        elif isinstance(n, ast.Compare) and len(n.ops) == 1 and isinstance(n.ops[0], (ast.Is, ast.IsNot)):
            shape_only.add(id(n.left))
    return any(isinstance(n, ast.Name) and n.id in names and isinstance(n.ctx, ast.Load) and id(n) not in shape_only
               for n in ast.walk(expr))


def _other_arm(func, line: int, node) -> bool:
    """`node` sits in the `elif`/`else` of an `if` whose body holds the read at `line`, outside any loop of `func`:
    quantize_embeddings' `if isinstance(e, Tensor): e = e.cpu().numpy()` then `elif isinstance(e, list):` never
    tests the value read, since a pass that read it skipped the other arm."""
    def within(sts, at):
        return any(st.lineno <= at <= (st.end_lineno or st.lineno) for st in sts)
    looped = {id(x) for lp in ast.walk(func) if isinstance(lp, (ast.For, ast.AsyncFor, ast.While))
              for st in lp.body + lp.orelse for x in ast.walk(st)}
    return any(isinstance(g, ast.If) and id(g) not in looped and within(g.body, line) and within(g.orelse, node.lineno)
               for g in ast.walk(func))


def _tainted(func, first: int, names: set[str]) -> set[str]:
    """`names` and those assigned, after line `first`, from an expression reading one of them (to a fixpoint):
    plain names only (`self.last = n` stores into `self`, it does not make `self` a read value), and not through a
    slice bound (`cut = x[:, :n]` is a tensor cut to a size: a test on it reads it again, on its own line)."""
    names = set(names)
    assigns = [n for n in ast.walk(func) if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.lineno > first
               and n.value is not None]
    grew = True
    while grew:
        grew = False
        for a in assigns:
            if _reads(a.value, names, bounds=False):
                for t in (a.targets if isinstance(a, ast.Assign) else [a.target]):
                    new = _stored(t) - names
                    names |= new
                    grew = grew or bool(new)
    return names


def _tests(func, after: int, names: set[str]):
    """(node, test) for each branch of `func` below line `after` whose test reads one of `names` (not one inside
    a `raise`: `f"id {hi if hi >= V else lo} is outside"` words the error of a check)."""
    raised = {id(x) for r in ast.walk(func) if isinstance(r, ast.Raise) for x in ast.walk(r)}
    for n in ast.walk(func):
        if getattr(n, "lineno", 0) <= after or id(n) in raised:
            continue
        if isinstance(n, (ast.If, ast.While, ast.IfExp)) and _reads(n.test, names):
            if isinstance(n, ast.If) and n.body and all(isinstance(s, ast.Raise) for s in n.body) and not n.orelse:
                continue  # a check: a replay skips it, the read that feeds it is the finding
            yield n, n.test
        elif isinstance(n, (ast.For, ast.AsyncFor)) and isinstance(n.iter, ast.Call) and \
                isinstance(n.iter.func, ast.Name) and n.iter.func.id == "range" and _reads(n.iter, names):
            yield n, n.iter


def _branches(tree, func, first: int, after: int, names: set[str], depth: int = 2):
    """(function, node, test, how the value got there) for each branch on `names` (bound at line `first`) below
    line `after` of `func`, and in the functions of this file it passes them to (`self.check(tok)`, then `if tok
    in self.stops:` in `check`), `depth` calls down."""
    names = _tainted(func, first, names)
    yield from ((func, node, test, "") for node, test in _tests(func, after, names))
    if depth <= 0:
        return
    for call in (n for n in ast.walk(func) if isinstance(n, ast.Call) and n.lineno > first):
        callee, skip = _callee(tree, func, call)
        if callee is None:
            continue
        params = [a.arg for a in callee.args.posonlyargs + callee.args.args][skip:]
        passed = {params[i] for i, a in enumerate(call.args) if i < len(params) and _reads(a, names, bounds=False)}
        passed |= {k.arg for k in call.keywords if k.arg in params + [a.arg for a in callee.args.kwonlyargs]
                   and _reads(k.value, names, bounds=False)}
        for fn, node, test, via in _branches(tree, callee, callee.lineno, callee.lineno, passed, depth - 1) if passed else ():
            yield fn, node, test, via or f", passed to `{callee.name}()` at line {call.lineno}"


def _callee(tree, func, call: ast.Call):
    """(def, leading parameters the call does not pass) of a function of this file a call names: `f(...)` a
    module-level function, `self.f(...)` a method of the class holding `func`; (None, 0) otherwise."""
    f = call.func
    if isinstance(f, ast.Name):
        defs = [d for d in tree.body if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef)) and d.name == f.id]
        return (defs[0], 0) if len(defs) == 1 else (None, 0)
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self":
        cls = next((c for c in ast.walk(tree) if isinstance(c, ast.ClassDef) and func in c.body), None)
        defs = [d for d in (cls.body if cls else ()) if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))
                and d.name == f.attr]
        return (defs[0], 1) if len(defs) == 1 else (None, 0)
    return None, 0


def _lines_ran(ctx) -> list[set]:
    """Per complete audited step, the (file, line) pairs any op's stack passed through."""
    return [{(c.co_filename, ln) for r in ctx.steps[s] for c, ln in r.stack} for s in ctx.complete]


def _forked(node, file: str, ran: list[set]) -> bool:
    """Some audited step ran ops on a line of the branch's body and another did not: the traced rule's."""
    body = getattr(node, "body", None)
    body = body if isinstance(body, list) else [body] if body is not None else []
    lines = {(file, ln) for st in body for ln in range(st.lineno, (st.end_lineno or st.lineno) + 1)}
    took = {bool(lines & step) for step in ran}
    return len(took) > 1


@register("data-dependent-control")
def branches_on_read_values(ctx):
    """A Python branch on a value read back from the device: a graph replays the side the captured step took."""
    out, seen, ran = [], set(), None
    for (file, line, op, _), group in ctx.per_site(read_records(ctx)).items():
        r = group[0]
        if r.kind != "host" or op not in _VALUE_READS or not file:
            continue
        if any(capture_guards.capture_guard(c.co_filename, n) for c, n in r.stack):
            continue  # eager decode reads it, a capture never does
        func = lookup.enclosing_function(file, line)
        st = _statement(func, line) if func is not None and func is not lookup.tree(file) else None
        names = _bound(st, line) if st is not None else set()
        if not names:
            continue
        loop = isinstance(st, (ast.For, ast.AsyncFor))  # its body runs after the read in its iterable
        caller = ctx.caller(r)
        caller = caller if caller and caller[0] != file else None  # in the target's own code the branch is its own line
        after = (st.iter.end_lineno if loop else st.end_lineno) or st.lineno
        for fn, node, test, via in _branches(lookup.tree(file), func, st.lineno, after, names):
            key = (file, node.lineno, caller[:2] if caller else None)
            if key in seen or (fn is func and _other_arm(func, line, node)):
                continue
            ran = _lines_ran(ctx) if ran is None else ran
            if _forked(node, file, ran):
                continue
            seen.add(key)
            kind = "sets the trip count of a loop" if isinstance(node, (ast.For, ast.AsyncFor)) else "decides a branch"
            out.append(ctx.finding(
                "data-dependent-control", (file, node.lineno, fn.name), "if", len(group) / ctx.n_steps,
                f"`{ast.unparse(test)}` {kind} on a value read back from the device at line {line} (`{op}`{via}): a "
                "graph replays the path of the step it captured, whatever later data says (found in the source; "
                "the audited steps all took the same path)",
                fix="Decide on the device (`torch.where`, a masked update), or end the captured step before the "
                    "read and branch on the host after the replay.",
                caller=caller))
    return out
