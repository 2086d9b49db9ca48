"""The host clock read in the step, its value reaching the device or a branch around device work.

`is_done = time.time() - self.start > self.max_time` feeding `torch.full(..., is_done)` (a time limit on
generation), a deadline that skips a draft step, a temperature annealed by wall time: eager reads the clock
every step, a replay never does, so the value seen at capture is used forever. Within one scan the value
rarely changes what runs (a time limit seldom expires in six steps), so the value-diffing rules cannot see
it; this rule reads the source of the functions that ran, follows the clock's value through local names,
and reports the read when the value is used by a statement on a line that issued ops, or in the test of a
branch whose body issued ops. A clock read kept for logging or metrics is not a finding (replay skips it, nothing
on the device depends on it).
"""

from __future__ import annotations

import ast
from collections import defaultdict

from audit.detectors import register
from audit.detectors.source import assign_targets, lookup
from audit.scan.sources.ast_nodes import all_nodes, nodes_of

_TIME = {"time", "monotonic", "perf_counter", "time_ns", "monotonic_ns", "perf_counter_ns", "process_time"}
_DATETIME = {"now", "utcnow", "today"}
_FUNC = (ast.FunctionDef, ast.AsyncFunctionDef)


def _clock_names(tree) -> tuple[set, set]:
    """(names bound to the time / datetime modules or classes, names bound to clock functions themselves).
    A clock function kept under another name counts too: a name assigned one (`_now = time.monotonic`), and an
    attribute, as `.name` (`self._clock = time.monotonic`, or `self.clock = clock` from a parameter whose default
    is one, `def __init__(self, clock=time.monotonic)`, or a class field `clock: Callable = time.monotonic`: an
    injectable clock, read as `self._clock()`)."""
    mods, funcs = set(), set()
    for node in all_nodes(tree):
        if isinstance(node, ast.Import):
            mods |= {a.asname or a.name for a in node.names if a.name in ("time", "datetime")}
        elif isinstance(node, ast.ImportFrom) and node.module == "time":
            funcs |= {a.asname or a.name for a in node.names if a.name in _TIME}
        elif isinstance(node, ast.ImportFrom) and node.module == "datetime":
            mods |= {a.asname or a.name for a in node.names if a.name == "datetime"}
    if mods or funcs:
        funcs |= _kept_clocks(tree, mods, funcs)
    return mods, funcs


def _is_clock_ref(node, mods: set, funcs: set) -> bool:
    """`time.monotonic` or a clock function's name, not called: the function itself."""
    if isinstance(node, ast.Name):
        return node.id in funcs
    return isinstance(node, ast.Attribute) and node.attr in _TIME | _DATETIME and _root(node) in mods


def _root(node) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _kept_clocks(tree, mods: set, funcs: set) -> set:
    """Names (`_now`) and attributes (`.clock`) a clock function is stored under, directly or through a
    parameter whose default is one."""
    out = set()
    for func in nodes_of(tree, _FUNC):
        a = func.args
        pos = a.posonlyargs + a.args
        pairs = [*zip(pos[len(pos) - len(a.defaults):], a.defaults), *zip(a.kwonlyargs, a.kw_defaults)]
        params = {p.arg for p, dflt in pairs if dflt is not None and _is_clock_ref(dflt, mods, funcs)}
        for n in ast.walk(func):
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Name) and n.value.id in params:
                out |= {"." + t.attr for t in n.targets if isinstance(t, ast.Attribute)}
    for n in all_nodes(tree):
        if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None and _is_clock_ref(n.value, mods, funcs):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            out |= {t.id if isinstance(t, ast.Name) else "." + t.attr for t in targets
                    if isinstance(t, (ast.Name, ast.Attribute))}
    for cls in nodes_of(tree, ast.ClassDef):  # a field: `clock: Callable = time.time`
        out |= {"." + s.target.id for s in cls.body if isinstance(s, (ast.Assign, ast.AnnAssign))
                and isinstance(getattr(s, "target", None), ast.Name) and s.value is not None
                and _is_clock_ref(s.value, mods, funcs)}
    return out


def _is_clock(node, mods: set, funcs: set) -> bool:
    """`time.time()`, `perf_counter()`, `datetime.now()`, `datetime.datetime.now()` (by the file's imports)."""
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    if isinstance(f, ast.Name):
        return f.id in funcs
    if isinstance(f, ast.Attribute) and "." + f.attr in funcs:  # a kept clock: `self._clock()`
        return True
    if not isinstance(f, ast.Attribute) or f.attr not in _TIME | _DATETIME:
        return False
    root = f.value
    while isinstance(root, ast.Attribute):
        root = root.value
    return isinstance(root, ast.Name) and root.id in mods


def _origin(expr, tainted: dict, mods: set, funcs: set) -> int | None:
    """The line of the clock read `expr` carries (directly, or through a tainted local name), else None."""
    for n in ast.walk(expr):
        if _is_clock(n, mods, funcs):
            return n.lineno
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in tainted:
            return tainted[n.id]
    return None


def _taint(func, mods: set, funcs: set) -> dict[str, int]:
    """Local name -> the clock read line its value comes from (assignments followed to a fixed point)."""
    tainted: dict[str, int] = {}
    for _ in range(4):
        before = len(tainted)
        for n in ast.walk(func):
            if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and n.value is not None:
                line = _origin(n.value, tainted, mods, funcs)
                # only the names the statement binds: `self.t[j] += clock() - t0` binds neither `self` nor `j`
                for t in assign_targets.written(n) if line is not None else ():
                    if isinstance(t, ast.Name):
                        tainted.setdefault(t.id, line)
        if len(tainted) == before:
            break
    return tainted


_COMPOUND = (ast.If, ast.While, ast.For, ast.AsyncFor, ast.With, ast.AsyncWith, ast.Try, ast.FunctionDef,
             ast.AsyncFunctionDef, ast.ClassDef, ast.Match)


def _sinks(func, issued: set, mods: set, funcs: set) -> list[tuple[int, str]]:
    """(clock line, kind) per use: "value" when it is read by a statement on a line that issued ops, "branch"
    when it is the test of an if / while whose body issued ops."""
    tainted, out = _taint(func, mods, funcs), []

    def ran(nodes) -> bool:
        return any(b.lineno <= ln <= (b.end_lineno or b.lineno) for b in nodes for ln in issued)

    for n in ast.walk(func):
        if isinstance(n, ast.stmt) and not isinstance(n, _COMPOUND) and ran([n]):
            if (line := _origin(n, tainted, mods, funcs)) is not None:
                out.append((line, "value"))
        elif isinstance(n, (ast.If, ast.While)) and ran([*n.body, *n.orelse]):
            if (line := _origin(n.test, tainted, mods, funcs)) is not None:
                out.append((line, "branch"))
    return out


def _function(code):
    t = lookup.tree(code.co_filename)
    for f in (() if t is None else all_nodes(t)):
        if isinstance(f, _FUNC) and f.name == code.co_name and \
                min([f.lineno] + [d.lineno for d in f.decorator_list]) == code.co_firstlineno:
            return t, f
    return t, None


_WHY = {"value": ("baked-host-value", "reaches the device", "Pass the value in through a device tensor that "
                  "prepare() fills each step (a deadline flag, a step count), or check the clock outside the step."),
        "branch": ("data-dependent-control", "decides a branch around device work",
                   "Decide outside the step (prepare() or the serving loop) and pass the result in as a device "
                   "flag applied with torch.where, or capture one graph per branch.")}


def _uses(ctx) -> tuple[dict, dict]:
    """((file, clock line, kind) -> code, code -> a record through it), computed once per scan for both rules.
    Only files that import a clock are searched for the function that ran."""
    cached = getattr(ctx, "_host_clock_uses", None)
    if cached is not None:
        return cached
    issued, via = defaultdict(set), {}  # code -> lines of it that issued ops; code -> a record through it
    for recs in ctx.steps:
        for r in recs:
            for code, line in r.stack:
                issued[code].add(line)
                via.setdefault(code, r)
    names, found = {}, {}  # file -> (clock modules, clock functions) it imports
    for code, lines in issued.items():
        if code.co_filename not in names:
            t = lookup.tree(code.co_filename)
            names[code.co_filename] = _clock_names(t) if t is not None else (set(), set())
        mods, funcs = names[code.co_filename]
        func = _function(code)[1] if mods or funcs else None
        for line, kind in _sinks(func, lines, mods, funcs) if func is not None else ():
            found.setdefault((code.co_filename, line, kind), code)
    ctx._host_clock_uses = found, via
    return found, via


def _found(ctx, which: str) -> list:
    uses, via = _uses(ctx)
    found = {(file, line): code for (file, line, kind), code in uses.items() if kind == which}
    cat, what, fix = _WHY[which]
    return [ctx.finding(cat, (file, line, code.co_name), "host clock", 1.0,
                        f"the host clock is read in the step and its value {what}: a replay never reads it again, "
                        "so the value seen at capture is used forever (a time limit never expires, a deadline "
                        "never passes)", severity="silent-corruption", fix=fix,
                        caller=ctx.caller_into(via[code], file, code.co_name))
            for (file, line), code in sorted(found.items(), key=lambda kv: kv[0])]


@register("baked-host-value")
def host_clock_values(ctx):
    """A host clock read whose value reaches a call that issued ops (`torch.full(..., elapsed > limit)`)."""
    return _found(ctx, "value")


@register("data-dependent-control")
def host_clock_branches(ctx):
    """A host clock read deciding a branch around device work (`if time.time() > deadline: skip the draft`)."""
    return _found(ctx, "branch")
