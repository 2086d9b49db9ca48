"""Source lookups for attribution: which branch separates two lines, what the source says about devices.

A trace knows the line of each op, not the `if` that chose it. To name the branch a person has to
change we parse the function's source and find the statement (if / for / while / try / match)
at which the two executions part ways. Parsing is cached per file.
"""

from __future__ import annotations

import ast

from audit.detectors.branches import key_tests
from audit.detectors.source import scopes
from audit.scan.sources.ast_nodes import all_nodes, attr_chain, calls_at, nodes_of
from audit.scan.sources.frame_source import tree

_BRANCH = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.Try, ast.Match)
_FUNC = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)

def _span(node, line: int) -> bool:
    return node.lineno <= line <= (node.end_lineno or node.lineno)


def enclosing_function(filename: str, line: int):
    """Innermost def containing `line` (or the module)."""
    t = tree(filename)
    if t is None:
        return None
    best = t
    for node in nodes_of(t, _FUNC):
        if _span(node, line) and (best is t or node.lineno >= best.lineno):
            best = node
    return best


def _fields(node):
    """(name, statements-or-expression) parts of a branching statement, in source order."""
    if isinstance(node, (ast.If, ast.While)):
        return [("test", node.test), ("body", node.body), ("orelse", node.orelse)]
    if isinstance(node, (ast.For, ast.AsyncFor)):
        return [("iter", node.iter), ("body", node.body), ("orelse", node.orelse)]
    if isinstance(node, ast.Try):
        return [("body", node.body)] + [(f"except{i}", h.body) for i, h in enumerate(node.handlers)] + \
               [("orelse", node.orelse), ("finalbody", node.finalbody)]
    if isinstance(node, ast.Match):
        return [("subject", node.subject)] + [(f"case{i}", c.body) for i, c in enumerate(node.cases)]
    return [("body", getattr(node, "body", []))]


def chain(func, line: int) -> list[tuple[ast.AST, str]]:
    """(branching statement, part) pairs that contain `line`, outermost first, inside `func`."""
    out = []
    body = func.body if isinstance(func.body, list) else []
    while body:
        stmt = next((s for s in body if _span(s, line)), None)
        if stmt is None or isinstance(stmt, _FUNC + (ast.ClassDef,)):
            break
        parts = _fields(stmt) if isinstance(stmt, _BRANCH) else [("body", getattr(stmt, "body", []))]
        body = []
        for name, part in parts:
            if isinstance(part, list):
                if part and any(_span(s, line) for s in part):
                    body = part
                    break
            elif _span(part, line):
                break
        else:
            name = None
        if isinstance(stmt, _BRANCH):
            out.append((stmt, name or "self"))
    return out


def branch_between(filename: str, la: int, lb: int | None) -> int | None:
    """Line of the statement where an execution at `la` and one at `lb` part ways (same function).

    lb None: the other execution ran nothing more, so take the innermost branch around `la`."""
    func = enclosing_function(filename, la)
    if func is None:
        return None
    ca = chain(func, la)
    if lb is None:
        return ca[-1][0].lineno if ca else None
    cb = chain(func, lb)
    for i in range(max(len(ca), len(cb))):
        a = ca[i] if i < len(ca) else None
        b = cb[i] if i < len(cb) else None
        if a and b and a[0] is b[0]:
            if a[1] == b[1]:
                continue
            return a[0].lineno
        return min(x[0].lineno for x in (a, b) if x)
    return None


def innermost_branch(filename: str, line: int) -> int | None:
    func = enclosing_function(filename, line)
    c = chain(func, line) if func is not None else []
    return c[-1][0].lineno if c else None


def chooser(filename: str, line: int) -> int | None:
    """The statement that chose which instance `line` ran on (steps ran the same line on different
    modules, e.g. experts): the innermost branch holding `line`, unless that is a loop whose body
    skips iterations before `line` with a guard (`if ...: continue/break`): the first such guard."""
    func = enclosing_function(filename, line)
    c = chain(func, line) if func is not None else []
    # both steps ran `line`: an `if` holding it that tests the loop's key against fixed things took one arm in both
    c = [(n, part) for n, part in c if not key_tests.fixed_key_test(func, n)]
    if not c:
        return None
    node = c[-1][0]
    if isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
        guards = [n.lineno for n in ast.walk(node) if isinstance(n, ast.If) and n.lineno < line
                  and not _span(n, line) and any(isinstance(x, (ast.Break, ast.Continue)) for x in ast.walk(n))
                  and not key_tests.fixed_key_test(func, n)]
        if guards:
            return min(guards)
    return node.lineno


def _computed(n) -> bool:
    """An expression that is not a literal (`self.bucket`, `f"head_{self.task}"`, `key`)."""
    return not isinstance(n, ast.Constant) and not (
        isinstance(n, ast.JoinedStr) and all(isinstance(v, ast.Constant) for v in n.values))


def _pick(value) -> bool:
    """A lookup of one module among several by a computed key: `self.heads[self.bucket]`,
    `getattr(self, f"head_{self.task}")`, `self.heads.get(key)`."""
    if isinstance(value, ast.Subscript):
        return _computed(value.slice)
    if not isinstance(value, ast.Call) or not value.args:
        return False
    if isinstance(value.func, ast.Name) and value.func.id == "getattr":
        return len(value.args) >= 2 and _computed(value.args[1])
    return isinstance(value.func, ast.Attribute) and value.func.attr == "get" and _computed(value.args[0])


def picked_by(filename: str, line: int) -> int | None:
    """The statement that picked the callee of a call on `line` by a computed key (`head =
    self.heads[self.bucket]`, `getattr(self, f"head_{task}")`, `self.heads.get(key)`, then
    `head(x)`): the latest such assignment before `line`."""
    func = enclosing_function(filename, line)
    if func is None:
        return None
    names = {n.func.id for n in ast.walk(func) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
             and n.lineno <= line <= (n.end_lineno or n.lineno)}
    picks = [n.lineno for n in ast.walk(func) if isinstance(n, ast.Assign) and n.lineno < line and _pick(n.value)
             and any(isinstance(t, ast.Name) and t.id in names for t in n.targets)]
    return max(picks, default=None)


def loop_guards(filename: str, line: int) -> set[int]:
    """Lines of the guard clauses (`if ...: continue/break`) in the body of the loop that starts on
    `line`; empty when no loop starts there."""
    t = tree(filename)
    loop = next((n for n in nodes_of(t, (ast.For, ast.AsyncFor, ast.While)) if n.lineno == line),
                None) if t is not None else None
    if loop is None:
        return set()
    return {n.lineno for n in ast.walk(loop) if isinstance(n, ast.If) and n is not loop
            and any(isinstance(x, (ast.Break, ast.Continue)) for x in ast.walk(n))}


def body_guard(filename: str, line: int) -> int | None:
    """The first `if` inside the innermost loop holding `line` that holds `line` or skips the rest of
    the iteration before it (`if not p.enabled: continue`); None without a loop or such an `if`. The
    loop body's line ran in both steps, so the trip count did not decide: a guard in the body did."""
    func = enclosing_function(filename, line)
    loop = _loop_of(func, line) if func is not None and not isinstance(func, ast.Module) else None
    if loop is None:
        return None
    cands = [n.lineno for n in ast.walk(loop) if isinstance(n, ast.If) and n.lineno < line
             and (_span(n, line) or any(isinstance(x, (ast.Break, ast.Continue)) for x in ast.walk(n)))
             and not key_tests.fixed_key_test(func, n)]
    return min(cands, default=None)


_EXITS = (ast.Return, ast.Raise, ast.Break, ast.Continue)


def exit_branch(filename: str, lo: int, hi: int) -> int | None:
    """First branching statement between lines lo..hi (of lo's function) that can leave early.

    One execution continued from `lo` to `hi` in this function while the other left it: the
    statement that decided is an `if ...: return` (or break/continue/raise) in between."""
    func = enclosing_function(filename, lo)
    if func is None:
        return None
    lo, hi = min(lo, hi), max(lo, hi)
    cands = [n for n in ast.walk(func) if isinstance(n, _BRANCH) and lo <= n.lineno <= hi
             and any(isinstance(x, _EXITS) for x in ast.walk(n))]
    return min((n.lineno for n in cands), default=None)


def _loop_of(func, line: int):
    """Innermost for/while statement of `func` whose body holds `line`."""
    loops = [n for n, part in chain(func, line) if isinstance(n, (ast.For, ast.AsyncFor, ast.While)) and part == "body"]
    return loops[-1] if loops else None


def skipped_loop_index(filename: str, line: int, indexed: str | None = None) -> bool:
    """Whether `line` reads the index of the innermost loop holding it (`for e in range(E)`) and a
    conditional in that loop, before `line`, can skip it in an iteration (an `if` holding `line`, or
    `if ...: continue / break`): which iteration reaches `line` first then depends on that conditional.
    `indexed`: the attribute the varying op indexes (`dev_cache`); where the line subscripts it, the
    index must be read there: `self.dev_cache[slot].copy_(self.table[k])` bakes `slot`, a host value of
    its own, however the loop over `k` skips."""
    func = enclosing_function(filename, line)
    loop = _loop_of(func, line) if func is not None and not isinstance(func, ast.Module) else None
    if not isinstance(loop, (ast.For, ast.AsyncFor)):
        return False
    index = {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
    read = {n.id for n in ast.walk(loop) if isinstance(n, ast.Name) and n.lineno == line}
    if indexed is not None:
        subs = [n.slice for n in ast.walk(loop) if isinstance(n, ast.Subscript) and n.lineno == line
                and (attr_chain(n.value) or [None])[-1] == indexed]
        if subs:
            read = {n.id for s in subs for n in ast.walk(s) if isinstance(n, ast.Name)}
    return bool(index & read) and (any(
        isinstance(n, ast.If) and n.lineno < line
        and (_span(n, line) or any(isinstance(x, (ast.Break, ast.Continue)) for x in ast.walk(n)))
        for n in ast.walk(loop) if n is not loop) or _breaks_inside(func, loop))


def _own(node):
    """The nodes under `node` that belong to its own loop level (not to a nested loop or function)."""
    for child in ast.iter_child_nodes(node):
        if not isinstance(child, (ast.For, ast.AsyncFor, ast.While, ast.FunctionDef, ast.AsyncFunctionDef,
                                  ast.Lambda)):
            yield child
            yield from _own(child)


def _breaks_inside(func, loop) -> bool:
    """`loop` runs inside another loop of `func`, and a conditional of its own body can `break` it (a
    verifier walking drafted tokens per sequence, stopping at the first rejection): each outer iteration
    then runs it a data-dependent number of times, so the k-th run of a line in it is another (outer, inner)
    pair in another step, whether the line comes before the `break` or after it."""
    if _loop_of(func, loop.lineno) is None:
        return False
    return any(isinstance(n, ast.If) and any(isinstance(x, ast.Break) for x in _own(n))
               for n in _own(loop))


def function_node(code):
    """The def of `code` in its file's syntax tree, or None."""
    t = tree(code.co_filename)
    return next((n for n in all_nodes(t) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and def_first_line(n) <= code.co_firstlineno <= n.body[0].lineno and n.name == code.co_name), None) \
        if t is not None else None


def decider(filename: str, lo: int | None, line: int) -> int | None:
    """The statement that decided whether `line` ran, after execution was last seen at `lo`.

    Both executions agreed up to `lo` (None: the function was just entered). Forward (lo <= line):
    the first branch in lo..line that holds `line` or can leave early (`if ...: return/continue/
    break` guards a later line without holding it). Backward (a new loop iteration): the first
    such guard inside the loop holding both lines, else the loop itself (its trip count); the
    same line twice is taken as another iteration too, and leaving the loop `lo` was in the same way."""
    func = enclosing_function(filename, line)
    if func is None or isinstance(func, ast.Module):
        return None
    lo = func.lineno if lo is None or not _span(func, lo) else lo

    def guard(n) -> bool:
        return _span(n, line) or any(isinstance(x, _EXITS) for x in ast.walk(n))

    left = _loop_of(func, lo)
    if left is not None and lo < line and not _span(left, line):
        loop = left  # execution left the loop it was in: its trip count (or a guard in it) decided
    elif lo <= line:
        cands = [n.lineno for n in ast.walk(func) if isinstance(n, _BRANCH) and lo <= n.lineno <= line and guard(n)]
        if cands or lo < line:
            return min(cands, default=None)
        loop = _loop_of(func, line)  # lo == line: the same line again, i.e. another iteration
    else:
        loop = _loop_of(func, line)
    if loop is None or not _span(loop, lo):
        return None
    cands = [n.lineno for n in ast.walk(loop) if n is not loop and isinstance(n, _BRANCH)
             and any(isinstance(x, (ast.Break, ast.Continue)) for x in ast.walk(n))
             and not key_tests.fixed_key_test(func, n)]
    return min(cands, default=loop.lineno)


# calls that copy to a `device=` argument, and the position it may also take: `t.to("cpu")`,
# `torch.as_tensor(t, None, "cpu")`; torch.asarray takes it by keyword only
_DEVICE_POSITION = {"to": 0, "as_tensor": 2, "asarray": None}


def names_cpu(filename: str, line: int) -> bool:
    """A `.to(...)` / `torch.as_tensor(...)` / `torch.asarray(...)` call on `line` whose target is the CPU:
    written there, or a name / `self.attr` assigned only the CPU (`self.host = torch.device("cpu")`), not a
    device variable."""
    t = tree(filename)
    if t is None:
        return False
    for n in calls_at(t, line):
        name = getattr(n.func, "attr", getattr(n.func, "id", None))
        if name in _DEVICE_POSITION:
            at = _DEVICE_POSITION[name]
            dev = [k.value for k in n.keywords if k.arg == "device"] + (n.args[at:at + 1] if at is not None else [])
            dev += [d for d in [_device_kw(n, filename)] if d is not None]  # `.to(**HOST_KW)`: its "device" entry
            if any(scopes.names_cpu(t, d, n.lineno) for d in dev):
                return True
    return False


def _calls_on(filename: str, line: int, names) -> list[ast.Call]:
    t = tree(filename)
    if t is None:
        return []
    return [n for n in calls_at(t, line) if getattr(n.func, "attr", getattr(n.func, "id", "")) in names]


def _device_kw(n: ast.Call, filename: str | None = None):
    """The call's `device=` argument: written at the call, or the "device" entry of a dict it splats
    (`torch.tensor(ids, **self.factory_kwargs)` with `self.factory_kwargs = {"device": device, ...}`)."""
    dev = next((k.value for k in n.keywords if k.arg == "device"), None)
    t = tree(filename) if dev is None and filename else None
    for k in (k for k in n.keywords if k.arg is None and t is not None):
        dicts = [k.value] if isinstance(k.value, ast.Dict) else [v for v, _ in scopes.values(t, k.value, n.lineno) or ()]
        found = [v for d in dicts if isinstance(d, ast.Dict)
                 for key, v in zip(d.keys, d.values) if isinstance(key, ast.Constant) and key.value == "device"]
        if found:
            dev = found[0]
            break
    return None if isinstance(dev, ast.Constant) and dev.value is None else dev


def _on_cpu(filename: str, dev) -> bool:
    """A `device=` argument that is the CPU: written so, or a name assigned only the CPU."""
    t = tree(filename)
    return t is not None and scopes.names_cpu(t, dev, dev.lineno)


def builds_on_device(filename: str, line: int) -> bool:
    """A `torch.tensor / as_tensor / asarray(data, device=<not the CPU>)` call on `line`, or
    `t.new_tensor(data)` (the data goes to t's device unless a CPU device is named)."""
    for n in _calls_on(filename, line, ("tensor", "as_tensor", "asarray", "new_tensor")):
        dev = _device_kw(n, filename)
        if getattr(n.func, "attr", "") == "new_tensor" and (dev is None or not _on_cpu(filename, dev)):
            return True
        if dev is not None and not _on_cpu(filename, dev):
            return True
    return False


HOST_FACTORIES = ("ones", "zeros", "empty", "full", "arange", "rand", "randn", "randint", "linspace", "eye",
                  "randperm", "scalar_tensor", "logspace", "range", "empty_strided", "triu_indices", "tril_indices",
                  "hann_window", "hamming_window", "blackman_window", "bartlett_window", "kaiser_window")


def exit_after(filename: str, line: int) -> int | None:
    """The first branch after `line`, in its function, that can leave the function early."""
    func = enclosing_function(filename, line)
    if func is None or isinstance(func, ast.Module):
        return None
    return exit_branch(filename, line + 1, func.end_lineno or line)


def def_first_line(node) -> int:
    """The first line of a def as its code object counts it (`co_firstlineno`): its first decorator's, if any."""
    return min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", ())])
