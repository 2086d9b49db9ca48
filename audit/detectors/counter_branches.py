"""Branches on a host counter, seen from the source when the audited steps never turned them.

`self.n += 1; if self.n % 100 == 0: log(y.norm().item())` takes the same side in every audited step, so the
op sequences agree and the trace shows neither the branch nor the wait it hides. Yet the counter keeps moving
on the host (a replay does not move it at all, cpu-side-effect) and the step the branch turns on is one a
graph cannot follow: the captured side replays forever. For every `if` (or conditional expression, or a check
that raises: `assert`, `torch._check`, read as `if` by `branches/raising_checks.py`, or a two-operand `min`/`max`,
read as a conditional expression by `branches/clamp_picks.py`) of the
target's own functions that ran, whose test reads a number the step changed (`self.n`, a module global, a
local bound from one, a parameter the caller passed one in: `branches/passed_counters.py`) or one changed between the steps
(a step index `prepare()` stages), we run the test
forward on the counter's own stride (the observed change per step) over the next few thousand steps and far
ahead, with the constants and plain number attributes it compares against; where it cannot be read that way
it counts as turning where it compares the counter as a number. A test that never turns (`self.n > 0` while
`n` grows) is left alone. A branch whose side differed between audited steps is op_sequence_divergence's.
The synchronizing calls of a side no audited step ran are host-sync, found in the source.
"""

from __future__ import annotations

import ast
import numbers

from audit.detectors import register
from audit.detectors.device import callee_waits
from audit.detectors.source.module_numbers import module_numbers
from audit.detectors.source.number_tables import module_tables
from audit.detectors.source.property_aliases import returned_attr_at
from audit.detectors.branches import library_code
from audit.detectors.branches.passed_counters import callers, passed
from audit.detectors.branches.raising_checks import as_ifs
from audit.detectors.branches.clamp_picks import as_ifexps, picks_moving
from audit.detectors.branches.counter_tests import compiled, grown, settled
from audit.detectors.branches.loop_values import combos, loop_values
from audit.detectors.state.sites import object_at, objects_defining
from audit.detectors.guarded_sync import _sync_call
from audit.scan.snapshot import class_state
from audit.scan.sources import loaded
from audit.scan.sources.ast_nodes import attr_chain, nodes_of
from audit.scan.sources.frame_source import function_of

_AHEAD = (*range(1, 4097), *(10 ** p for p in range(4, 13)))  # steps ahead the test is run at


def _number(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


_SIZED = ("list", "tuple", "deque", "dict", "set", "frozenset")  # fingerprints that carry a length


def _length(v):
    """The length a container's fingerprint carries (`("list", 3, ...)`), else None."""
    return v[1] if isinstance(v, tuple) and len(v) > 1 and v[0] in _SIZED and isinstance(v[1], int) else None


def _counters(ctx) -> dict:
    """(owner, attr) -> per-step (before, after) of the plain numbers the audited steps changed, and of those
    changed between them (prepare() staging a step index the step only reads), each tagged by which it was.
    A container whose length moves step after step (`self.hist.append(x)`) counts too, as `len:<attr>`: its
    length is the counter `len(self.hist)` reads; one refilled from the same length every step is not."""
    out: dict = {}
    for kind, per_step in (("step", ctx.trace.changes), ("staged", getattr(ctx.trace, "staged", []))):
        for s in ctx.complete:
            for c in per_step[s] if s < len(per_step) else ():
                key, before, after = (c.owner, c.attr), c.before, c.after
                if (n := _length(before)) is not None and (m := _length(after)) is not None:
                    key, before, after = (c.owner, f"len:{c.attr}"), n, m
                if _number(before) and _number(after) and before != after and \
                        out.setdefault(key, (kind, []))[0] == kind:
                    out[key][1].append((before, after))
    return {k: (kind, hist) for k, (kind, hist) in out.items() if hist and not (
        k[1].startswith("len:") and (len(hist) < 2 or len({b for b, _ in hist}) < 2))}


def _self_paths(ctx, code) -> list[str]:
    """Paths of the traced objects whose class (or a base) defines the function `code` belongs to."""
    return [p for p, _ in objects_defining(ctx, code.co_filename, code.co_firstlineno, code.co_name)]


def _refs(func, code, ctx, counters, paths: list) -> dict:
    """id(node) -> (owner, attr) for the reads of a changed counter in the function: `self.<path>.attr`
    (through the objects of the function's class) and a bare module global of the function's module."""
    args = func.args.posonlyargs + func.args.args
    me = args[0].arg if args else None
    selves = paths if me else []
    mods = {o[8:-1] for o, _ in counters if o.startswith("<module ")}
    globs = {a for o, a in counters if o.startswith("<module ") and "." not in a
             and getattr(loaded.module_named(o[8:-1]), "__file__", None) == code.co_filename} if mods else set()
    classes = _classes(ctx, code, me, counters, paths)
    out = {}
    for n in nodes_of(func, ast.Call):  # `len(self.hist)`: the length of a container the step grows
        if isinstance(n.func, ast.Name) and n.func.id == "len" and len(n.args) == 1 and not n.keywords and \
                (ch := attr_chain(n.args[0])) and ch[0] == me and len(ch) > 1:
            for base in selves:
                owner = ".".join(p for p in (base, *ch[1:-1]) if p)
                if (owner, f"len:{ch[-1]}") in counters:
                    out[id(n)] = (owner, f"len:{ch[-1]}")
    for n in nodes_of(func, (ast.Attribute, ast.Name)):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and (n.value.id, n.attr) in classes:
            out[id(n)] = classes[(n.value.id, n.attr)]
            continue
        if isinstance(n, ast.Name):
            if n.id in globs and isinstance(n.ctx, ast.Load) and n.id not in code.co_varnames:
                owner = next(o for o, a in counters if a == n.id and o.startswith("<module "))
                out[id(n)] = (owner, n.id)
            continue
        ch = attr_chain(n)
        if not ch or ch[0] != me or not isinstance(n.ctx, ast.Load):
            continue
        for base in selves:
            owner = ".".join(p for p in (base, *ch[1:-1]) if p)
            attr = ch[-1] if (owner, ch[-1]) in counters else returned_attr_at(ctx, owner, ch[-1])
            if (owner, attr) in counters:  # `self.step_index`, a property returning `self._step_index`
                out[id(n)] = (owner, attr)
    return out


def _through(ctx, counters, above, code, func, depth=0) -> dict:
    """A caller's counter refs (`_refs`), with the reads of a parameter its own caller passed a counter in
    straight (`self.attn(x, self.kv_len)` into `forward(self, x, kv_len)`, then `self.rotary(x, seq_len=kv_len)`):
    the counter reaches the test through more than one call."""
    refs = _refs(func, code, ctx, counters, _self_paths(ctx, code))
    if depth < 3:
        given, args = passed(above, code, func, lambda c, f: _through(ctx, counters, above, c, f, depth + 1))
        refs.update(given)
        for n in nodes_of(func, ast.Name):
            if isinstance(n.ctx, ast.Load) and id(args.get(n.id)) in given:
                refs[id(n)] = given[id(args[n.id])]
    return refs


def _classes(ctx, code, me, counters, paths: list) -> dict:
    """(name, attr) -> (owner, attr) for a class-level counter (`Cache.evictions += 1`) read as `Cls.attr`, or as
    `self.attr` / `cls.attr` in a method of the class or of a subclass."""
    out = {}
    for owner, attr in counters:
        cls = class_state.CLASSES.get(owner) if owner.startswith("<class ") else None
        if cls is None or "." in attr or attr.startswith("len:"):
            continue
        out[(cls.__name__, attr)] = (owner, attr)
        mine = code.co_qualname.rsplit(".", 1)[0] if "." in getattr(code, "co_qualname", "") else None
        ours = any(isinstance(obj, cls) for obj in (object_at(ctx, p) for p in paths)) or \
            any(c.__qualname__ == mine for c in cls.__subclasses__() + [cls])
        for name in (me, "cls") if ours and me else ():
            out[(name, attr)] = (owner, attr)
    return out


def _bound(func, refs, seed=None) -> dict:
    """Local name -> the expression it is bound from, where that reads a counter (`step = self.n`), also through
    other such locals (`current = self.n`, then `is_full = current >= self.cap`, then `if is_full:`)."""
    out: dict = dict(seed or {})  # `seed`: parameters bound to a caller's counter (passed_counters)
    assigns = [a for a in nodes_of(func, ast.Assign) if len(a.targets) == 1 and isinstance(a.targets[0], ast.Name)]
    grew = True
    while grew:
        grew = False
        for a in assigns:
            name = a.targets[0].id
            if name not in out and any(id(n) in refs or isinstance(n, ast.Name) and n.id in out and n.id != name
                                       for n in ast.walk(a.value)):
                out[name] = a.value
                grew = True
    return out


def _reads(test, refs, bound, depth=0) -> list:
    """The (owner, attr) counters a test reads, directly or through locals bound from one."""
    out = [refs[id(n)] for n in ast.walk(test) if id(n) in refs]
    for n in ast.walk(test):
        if isinstance(n, ast.Name) and n.id in bound and depth < 4:
            out += _reads(bound[n.id], refs, bound, depth + 1)
    return list(dict.fromkeys(out))


def _turns(test, counter, refs, bound, stride, last, selves, consts=None, moving=None, history=(), read_only=False) -> bool:
    """Whether the test's value changes over the steps ahead, the counter moving by its stride; True where
    the test reads anything but the counter, constants and plain numbers of the object it runs on, unless
    `read_only` (a library's test: only one run forward counts; rotary_embedding_torch compares its cached
    length with `t.shape[seq_dim]`, a size that grows with it, and such a test would be reported on every
    library that keeps a cache). `moving`:
    the other counters the test reads, (stride, last) each, which move ahead with it (`seq_len > self.cached`
    with the cache length set to `seq_len` every step never turns). A table the step grew with the counter over
    its `history` is no fixed table: that test does not turn."""
    others = {c: m for c, m in (moving or {}).items() if c != counter}
    names = {counter: "_c", **{c: f"_m{i}" for i, c in enumerate(others)}}
    found = compiled(test, counter, refs, bound, selves, consts, names)
    if found is None:  # unread: a schedule only where the counter is compared as a number (`self.pos + t > cap`)
        return not read_only and _scheduled(test, counter, refs, bound)
    if history and grown(found, history):
        return False
    return _differs(found, [{"_c": last + k * stride, **{names[c]: b + k * d for c, (d, b) in others.items()}}
                            for k in (0, *_AHEAD)])


def _differs(found, values) -> bool:
    """Whether the compiled test takes more than one value over the counter's `values` (True when it raises);
    a value is the counter's number, or the numbers of all the counters it reads by name."""
    code, env = found
    try:
        return len({bool(eval(code, {"__builtins__": {}}, {**(v if isinstance(v, dict) else {"_c": v}), **env}))
                    for v in values}) > 1
    except Exception:  # noqa: BLE001 - a division by zero or an overflow ahead: not a settled test
        return True


def _took_both(test, counter, refs, bound, history, selves, consts=None, loops=None) -> bool:
    """Whether the test already took both values in the audited steps (read before or after the counter moved):
    a one-line conditional expression whose sides no line tells apart (`a if self.k % 2 else b`) forked then,
    which op_sequence_divergence reports. `loops`: the values a loop around the test gives names it reads
    (`branches/loop_values.py`), every one of which each step ran."""
    found = compiled(test, counter, refs, bound, selves, consts, loops=loops)
    each = combos(loops) if loops else [{}]
    return found is not None and all(_differs(found, [{"_c": v, **e} for v in vs for e in each])
                                     for vs in ([b for b, _ in history], [a for _, a in history]))


def _scheduled(test, counter, refs, bound) -> bool:
    """Whether the counter (or a local bound from it) is in an operand of an order or equality comparison of the
    test (`self.pos + t > cap`); a membership or identity test on it (`self.n not in self.cache`) is not."""
    def reads(e, depth):
        return any(id(n) in refs and refs[id(n)] == counter or isinstance(n, ast.Name) and n.id in bound and
                   depth < 4 and reads(bound[n.id], depth + 1) for n in ast.walk(e))

    def compares(e, depth):  # the test's comparisons, and those of the locals it reads (`last = self.i == n - 1`)
        for n in ast.walk(e):
            if isinstance(n, ast.Compare):
                yield n
            elif isinstance(n, ast.Name) and n.id in bound and depth < 4:
                yield from compares(bound[n.id], depth + 1)
    return any(not isinstance(n.ops[0], (ast.In, ast.NotIn, ast.Is, ast.IsNot)) and
               any(reads(x, 0) for x in (n.left, *n.comparators)) for n in compares(test, 0))


def _ran(ctx) -> tuple[dict, list]:
    """The code objects the audited steps ran ops in, the target's own and an installed library's (a cache layer's
    `is_full = self.cumulative_length_int >= self.max_cache_len`), each with the target's own frames that called
    into it (none for its own code: the site is its own caller); and per step the ops dispatched on the way
    through each (file, line)."""
    codes, lines = {}, []
    for s in ctx.complete:
        seen: dict = {}
        for r in ctx.steps[s]:
            own = None
            for code, line in r.stack:
                if ctx.trace.is_own(code):
                    codes.setdefault(code, {})
                    own = (code.co_filename, line, code.co_name)
                elif own is not None and library_code.is_library(ctx, code):
                    codes.setdefault(code, {})[own] = None
                seen.setdefault((code.co_filename, line), []).append(r.op)
        lines.append(seen)
    return codes, lines


def _sides(node, file: str, lines: list) -> set:
    """Per audited step, which sides of the branch ran an op (for a conditional expression, whose sides share
    their lines, the ops its lines ran): one pattern where the steps agreed."""
    if isinstance(node, ast.IfExp):
        span = range(node.lineno, (node.end_lineno or node.lineno) + 1)
        ops = {tuple(op for n in span for op in seen.get((file, n), ())) for seen in lines}
        return {(False, False)} if len(ops) == 1 else ops

    def ran(body, seen):
        return any((file, n) in seen for st in body for n in range(st.lineno, (st.end_lineno or st.lineno) + 1))
    return {(ran(node.body, seen), ran(node.orelse, seen)) for seen in lines}


def _branches(ctx):
    """(code, node, counter, kind, history, sides, caller) for every branch of the target's own functions, or of
    a library's it called into (one per calling line: `caller`), that reads a counter the step advances and would
    turn on a later step, where the audited steps all took one side."""
    counters = _counters(ctx)
    if not counters:
        return
    codes, lines = _ran(ctx)
    above = callers(ctx)
    for code, entry in codes.items():
        func = function_of(code)
        paths = _self_paths(ctx, code) if func is not None else []  # the objects the function runs on
        refs = _refs(func, code, ctx, counters, paths) if func is not None else {}
        given, args = passed(above, code, func, lambda c, f: _through(ctx, counters, above, c, f)) \
            if func is not None else ({}, {})
        refs.update(given)  # a parameter the caller passed a counter in (`self.rope(h, self.seq_len)`)
        if not refs:
            continue
        bound = {**_bound(func, refs, args), **args}
        selves = [object_at(ctx, p) for p in paths]
        local = set(code.co_varnames) | set(code.co_cellvars) | set(code.co_freevars)
        consts = {k: v for k, v in {**module_tables(code), **module_numbers(code)}.items() if k not in local}
        chained = {id(n.orelse[0]): n for n in nodes_of(func, ast.If)
                   if len(n.orelse) == 1 and isinstance(n.orelse[0], ast.If)}  # `elif` -> its `if`
        turned: set = set()
        # `assert`, `torch._check` as ifs; two-operand `min`/`max` as conditional expressions
        for node in [*nodes_of(func, (ast.If, ast.IfExp)), *as_ifs(func), *as_ifexps(func)]:
            if id(chained.get(id(node))) in turned:
                turned.add(id(node))  # an `elif` of a test that turns: that test decides first, one finding
                continue
            sides = _sides(node, code.co_filename, lines)
            if len(sides) > 1:
                continue  # the audited steps took different sides: op_sequence_divergence reports it
            read = _reads(node.test, refs, bound)
            moving = {c: (counters[c][1][-1][1] - counters[c][1][-1][0], counters[c][1][-1][1]) for c in read}
            for counter in read:
                kind, history = counters[counter]
                before, after = history[-1]
                loops = loop_values(func, node, lambda e: settled(e, counter, refs, bound, selves, consts))
                if sides <= {(True, True), (False, False)} and \
                        _took_both(node.test, counter, refs, bound, history, selves, consts, loops):
                    # (True, True): both sides on the lines every step ran: the test itself says the steps forked;
                    # (False, False): the audited steps walked both sides and neither ran an op (a host free
                    # list popped every few positions): no kernel hangs on the test, the Python work is state
                    break
                if picks_moving(node, compiled(node.test, counter, refs, bound, selves, consts), after,
                                lambda e: _reads(e, refs, bound)):
                    break  # the clamp's value moved: the op taking it is baked-host-value's
                if _turns(node.test, counter, refs, bound, after - before, after, selves, consts, moving, history,
                          read_only=bool(entry)):
                    turned.add(id(node))
                    for caller in list(entry) or [None]:  # a library's branch: one per calling line of the target
                        yield code, node, counter, kind, history, next(iter(sides)), caller
                    break


def _name(counter) -> str:
    owner, attr = counter
    size = attr.startswith("len:")
    attr = attr[4:] if size else attr
    name = f"{owner}.{attr}" if owner and not owner.startswith("<") else attr
    return f"len({name})" if size else name


def _moved(kind: str, short: bool = False) -> str:
    if kind == "staged":
        return "set between the steps" if short else "which changes between the steps (set outside the step, read in it)"
    return "advanced by the step" if short else "which the step advances"


@register("data-dependent-control")
def branches_on_advanced_counters(ctx):
    """A Python branch on a host counter the step advances: the side a graph captured replays on every step."""
    out = []
    for code, node, counter, kind, history, sides, caller in _branches(ctx):
        took = {(True, False): "the `if` side", (False, True): "the `else` side"}.get(sides, "the same side")
        seen = ", ".join(str(a) for _, a in history[:4])
        other = [st for side, body in zip(sides, (node.body, node.orelse)) if not side for st in body] \
            if isinstance(node, ast.If) else []
        then = "the check that raises there never runs on a replay" if other and all(
            isinstance(st, ast.Raise) for st in other) else "a graph replays only the captured side"
        out.append(ctx.finding(
            "data-dependent-control", (code.co_filename, node.lineno, code.co_name), "if", 0.0,
            f"`{ast.unparse(node.test)}` reads `{_name(counter)}`, {_moved(kind)} ({seen}); the audited "
            f"steps all took {took}, but on a later step the test turns and {then} (found by running the "
            "test forward on the counter's stride, not traced)",
            fix="Decide on the device (`torch.where` on a device counter), or run the rare side outside the "
                "captured step, on the host's schedule.", caller=caller))
    return out


@register("host-sync")
def syncs_behind_advanced_counters(ctx):
    """The waits in the side of a counter branch that no audited step ran: a later step runs them."""
    out = []
    for code, node, counter, kind, _, sides, caller in _branches(ctx):
        if not isinstance(node, ast.If):
            continue
        sts = [st for side, body in zip(sides, (node.body, node.orelse)) if not side for st in body]
        file = code.co_filename
        waits = [(file, c.lineno, code.co_name, w) for st in sts for c in ast.walk(st) if (w := _sync_call(c))]
        for wfile, line, fname, what in [*waits, *callee_waits.waits_below(file, sts, _sync_call, ctx.trace.roots)]:
            out.append(ctx.finding(
                "host-sync", (wfile, line, fname), what, 0.0,
                f"`{what}()` runs on the steps where `{ast.unparse(node.test)}` (line {node.lineno}) turns, with "
                f"`{_name(counter)}` {_moved(kind, short=True)}; the audited steps did not take it, a later step does "
                "and waits for the device inside the step (found in the source, not traced)",
                fix="Move the read out of the captured step (read it after the step, on the host's schedule).",
                caller=caller or (None if wfile == file else (file, node.lineno, code.co_name))))
    return out
