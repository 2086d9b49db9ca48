"""Where Python state that changed inside a frame torch did not record lives: the suspended frame of a
generator the step advanced, a hook object torch calls from a module's call (and the target's call of
that module), a library function's closure; and which candidate lines explain a change. Shared by the cpu-side-effect rule (side_effect.py)."""

from __future__ import annotations

import ast
import builtins
import contextlib
import inspect
import linecache
import re
import sys
import types

from audit.detectors.state import hook_guards, keyed_writes
from audit.detectors.source import lookup, mutations
from audit.scan.snapshot.own_dict import own_dict
from audit.scan.sources.ast_nodes import all_nodes, nodes_of
from audit.scan.patches import module_hooks
from audit.scan.snapshot import class_state, state
from audit.scan.sources import loaded
from audit.scan.sources.user_code import HIDDEN, LIBRARY, frame_kind


def code_span(code) -> tuple[int, int]:
    """(first, last) source line of a code object."""
    return code.co_firstlineno, max((ln for *_, ln in code.co_lines() if ln), default=code.co_firstlineno)


def object_at(ctx, path: str):
    """The object reachable from the target at `path` (as the state snapshot names it), else None."""
    for p, obj in ctx.trace.objects:
        if p == path:
            return obj
    return None


def objects_defining(ctx, filename: str, first: int, name: str) -> list[tuple[str, object]]:
    """(path, object) of the traced objects whose class (or a base) defines the function `name` whose code starts
    at `filename:first` (its first decorator's line): the objects a method of the step runs on."""
    out = []
    for path, obj in ctx.trace.objects:
        for cls in type(obj).__mro__[:-1]:
            fn = cls.__dict__.get(name)
            fn = getattr(fn, "__func__", fn)
            code = getattr(inspect.unwrap(fn), "__code__", None) if callable(fn) else None
            if code is not None and code.co_filename == filename and code.co_firstlineno == first:
                out.append((path, obj))
                break
    return out


_GEN_LOCAL = re.compile(r"(\w+)[=@]([^,>]*)")


def generator_sites(ctx, change) -> list:
    """For a library's generator the step advanced (`self.writer.send(h)`): the statements of its function
    after its first `yield` that change the locals whose values differ (`pos += 1`); the target's call is
    their caller. (The target's own generator is reported at its own call, `next(self.positions)`.)"""
    obj = None if change.owner.startswith("<") or "." in change.attr else object_at(ctx, change.owner)
    gen = getattr(obj, change.attr, None) if obj is not None else None
    if not inspect.isgenerator(gen) or frame_kind(gen.gi_code.co_filename, ctx.trace.roots) != LIBRARY:
        return []
    before, after = (dict(_GEN_LOCAL.findall(str(v[1]).partition(": ")[2])) if whole_state_fp(v) else {}
                     for v in (change.before, change.after))
    code = gen.gi_code
    span = code_span(code)
    names = [k for k in dict.fromkeys([*before, *after]) if before.get(k) != after.get(k)]
    first = _first_yield(code)
    return [(code.co_filename, line, fn) for k in names
            for line, fn in mutations.mutation_sites(code.co_filename, k, span, global_name=True)
            if fn == code.co_name and line > first][:3]


def _first_yield(code) -> int:
    """The line of the first `yield` in the generator function of `code` (its set-up runs before it)."""
    t = mutations.tree(code.co_filename)
    for fn in all_nodes(t) if t is not None else ():
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.name == code.co_name \
                and lookup.def_first_line(fn) <= code.co_firstlineno <= fn.body[0].lineno:
            return min((n.lineno for n in ast.walk(fn) if isinstance(n, (ast.Yield, ast.YieldFrom))), default=0)
    return 0


def whole_state_fp(fp) -> bool:
    """An object compared by its state as a whole: `("obj", "<generator writer: pos=3>")`."""
    return isinstance(fp, tuple) and len(fp) == 2 and fp[0] == "obj"


_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks")


def hook_caller(ctx, changed: str, step: int):
    """For state inside a hook hung on a module (`proj._forward_hooks.0`): torch runs the hook from the
    module's call, so the target's own line that called the module (`h = self.proj(x)`) is the caller:
    the innermost own frame outside the module's forward on a record of an op run inside the module."""
    parts = changed.split(".")
    cut = next((i for i, p in enumerate(parts) if p in _HOOK_DICTS), None)
    if not cut:
        return None
    path = ".".join(parts[:cut])
    fwd = getattr(getattr(type(object_at(ctx, path)), "forward", None), "__code__", None)
    for r in ctx.steps[step]:
        if r.module != path and not r.module.startswith(path + "."):
            continue
        k = next((k for k, (code, _) in enumerate(r.stack) if code is fwd), len(r.stack))
        own = [f for f in r.stack[:k] if ctx.trace.is_own(f[0])]
        if own:
            return (own[-1][0].co_filename, own[-1][1], own[-1][0].co_name)
    return None


def closure_functions(ctx, owner: str) -> list:
    """The functions whose closure cells the state key `<closure Q>` names: those hung on an object of
    the target (a library's forward pre-hook in a module's hook dict), the methods of the classes whose
    state the scan keeps (a library decorator's wrapper on a method: `functools.wraps` gives it the
    method's name) and the globals of loaded modules (a decorated function), matched by qualified name."""
    qual = owner[len("<closure "):-1]
    seen, out = set(), []
    cands = [fn for _, obj in ctx.trace.objects for fn in state._functions(obj)]
    classes = [c for _, obj in ctx.trace.objects for c in type(obj).__mro__[:-1]]  # this target's classes first
    cands += [getattr(v, "__func__", v) for cls in dict.fromkeys(classes + list(class_state.CLASSES.values()))
              for v in list(vars(cls).values()) if isinstance(getattr(v, "__func__", v), types.FunctionType)]
    cands += [v for name, m, f in loaded.with_files() if name.split(".")[0] not in sys.stdlib_module_names
              and frame_kind(f, ctx.trace.roots) != HIDDEN
              for v in list(vars(m).values()) if isinstance(v, types.FunctionType)]
    for fn in cands:
        if fn.__qualname__ == qual and id(fn) not in seen and fn.__closure__:
            seen.add(id(fn))
            out.append(fn)
    return out[:1] if out and _in_class(out[0], classes) else out


def _in_class(fn, classes) -> bool:
    """Whether `fn` is a method (or a wrapper standing for one) of one of `classes`: then it is the closure,
    and a function of the same name elsewhere (a class of another target loaded earlier) is not."""
    return any(getattr(v, "__func__", v) is fn for cls in classes for v in list(vars(cls).values()))


def state_fps(change) -> str:
    """The change's before and after, to tell one object reached under two names."""
    return repr((change.before, change.after))


def tensor_slot_line(ctx, change, site, escaped) -> bool:
    """A site whose line writes an element of the container that changed only in which tensor it holds,
    and that is not the line rebinding it to another tensor, or is one whose new tensor step-allocation
    reports as escaping (`d["hist"][0] = v` writes into the tensor; `d["hist"] = torch.roll(...)`)."""
    glob = change.owner.startswith(("<module ", "<closure ")) and "." not in change.attr
    attr = change.attr.split(".")[-1]
    key = mutations.subscript_key(site[0], site[1], attr, global_name=glob)
    if key is None or not change.tensor_rebound(key):
        return False
    if (ctx.rel(site[0]), site[1]) in escaped or not mutations.stores_element(site[0], site[1], attr, key, glob):
        return True
    from audit.detectors.allocation import escaped_slot  # the allocation rule's escapes, computed once per scan
    return escaped_slot(ctx, change, key)


def unchanged_slot_line(change, site) -> bool:
    """A site whose line writes a container element, named by a constant key, that the step left as it
    was (`_STATE["enabled"] = prev` restored on exit, while `_STATE["iteration"]` advanced), or writes only
    inside such an element (`self.stats["max_err"][name] = e` while `stats["calls"]` counted on)."""
    glob = change.owner.startswith(("<module ", "<closure ")) and "." not in change.attr
    attr = change.attr.split(".")[-1]
    key = mutations.subscript_key(site[0], site[1], attr, global_name=glob)
    return key is not None and change.element_unchanged(key) and (  # not `del x[0]`, which shifts the rest
        mutations.stores_element(site[0], site[1], attr, key, glob)
        or keyed_writes.writes_inside_element(site[0], site[1], attr, key, glob))


def caller_of(ctx, site, step: int):
    """The target's own line that led into the function of a source site, through a record of the
    step that ran inside that function (None: the function is the target's own, or never seen)."""
    file, line, fn = site
    for r in ctx.steps[step]:  # the function holding the line: two `__call__` of one file are two functions
        if any(code.co_filename == file and code.co_name == fn and _holds(code, line) for code, _ in r.stack):
            return ctx.caller_into(r, file, fn)
    return None


def _holds(code, line: int) -> bool:
    first, last = code_span(code)
    return first <= line <= last


def generated_sites(ctx, change, own_files: set, ran: set) -> list:
    """(file, line, function) for state in the namespace a function was exec'd into (`<globals Q>`): its
    statements when its source can be read, else the target's calls of it (`self.epi(h)`), found by the
    names that hold it (an attribute of an object of the target, a module global), functions that ran first."""
    fns = list(state.GENERATED.get(change.owner, {}).values())
    code = fns[0].__code__ if fns else None
    if code is not None and linecache.getlines(code.co_filename):
        return [(code.co_filename, line, f) for line, f in mutations.mutation_sites(
            code.co_filename, change.attr.split(".")[0].split("[")[0], code_span(code), global_name=True)]
    held = {id(fn) for fn in fns}
    names = {k for _, obj in ctx.trace.objects for k, v in list(own_dict(obj).items()) if id(v) in held}
    names |= {k for f in own_files for _, m in loaded.modules_in(f) for k, v in list(vars(m).items()) if id(v) in held}
    hits = []
    for f in sorted(own_files):
        t = mutations.tree(f)
        for func in nodes_of(t, (ast.FunctionDef, ast.AsyncFunctionDef)) if t else ():
            hits += [((f, func.name) not in ran, n.lineno, f, func.name) for n in ast.walk(func)
                     if isinstance(n, ast.Call) and getattr(n.func, "attr", getattr(n.func, "id", None)) in names]
    return [(f, line, name) for _, line, f, name in sorted(hits)[:3]]


def hooked_call(ctx, site, step: int):
    """For a site in a hook torch ran from a module's call that ran no torch op itself (a library's
    recorder appending to a list, a profiler hook counting calls in its globals): the target's own line
    that called the module. A process-wide hook whose statement sits under `if isinstance(mod, C):`
    counts only at calls of a C module. None when no hooked call ran the site's function."""
    file, line, _ = site
    calls = ctx.trace.hook_calls[step] if step < len(ctx.trace.hook_calls) else ()
    for hooks, mod, stack in calls:
        fns = [fn for fn in map(module_hooks.function_of, hooks)
               if fn is not None and fn.__code__.co_filename == file and _holds(fn.__code__, line)]
        if not fns or not _admits(fns[0], line, mod):
            continue
        own = ctx.trace.own_frames(stack)
        if own:
            return own[-1][0].co_filename, own[-1][1], own[-1][0].co_name
    return None


def _admits(fn, line: int, mod) -> bool:
    """Whether module `mod` passes the `isinstance(<the hook's module parameter>, C)` tests of the `if`s
    around `line` in hook `fn`, and their other tests made of reads alone (`hasattr(mod, "lora_A")`,
    `hook_guards`); True when there are none, or they cannot be read."""
    mtype = type(mod)
    t = mutations.tree(fn.__code__.co_filename)
    node = next((n for n in all_nodes(t) if isinstance(n, (ast.FunctionDef, ast.Lambda))
                 and getattr(n, "lineno", 0) == fn.__code__.co_firstlineno), None) if t is not None else None
    args = node.args.posonlyargs + node.args.args if node is not None else []
    if not args:
        return True
    param = args[1 if args[0].arg in ("self", "cls") and len(args) > 1 else 0].arg
    for n in ast.walk(node):
        if not isinstance(n, ast.If) or not n.body or not (n.body[0].lineno <= line <= n.body[-1].end_lineno):
            continue
        test = n.test
        if isinstance(test, ast.Call) and getattr(test.func, "id", None) == "isinstance" and len(test.args) == 2 \
                and getattr(test.args[0], "id", None) == param:
            with contextlib.suppress(Exception):
                if not issubclass(mtype, _resolve(test.args[1], fn.__globals__)):
                    return False
        elif not hook_guards.passes(n, line, param, mod, fn.__globals__):
            return False
    return True


def _resolve(expr, glob):
    """A class (or tuple of classes) named by `nn.Linear`, `Linear` or `(A, B)` in a function's globals."""
    if isinstance(expr, ast.Tuple):
        return tuple(_resolve(e, glob) for e in expr.elts)
    if isinstance(expr, ast.Name):
        return glob[expr.id] if expr.id in glob else getattr(builtins, expr.id)
    if isinstance(expr, ast.Attribute):
        return getattr(_resolve(expr.value, glob), expr.attr)
    raise TypeError(expr)


def called_by_name(ctx, site, step: int, names=()):
    """For a site in a library function that ran no torch op: the target's own line that led into a library
    function of the step's stacks whose body calls the site's function by name (an accelerate-style
    `new_forward` calling `module._hf_hook.pre_forward(...)`, the hook object counting there), or by one of
    `names` (the attribute a partial or closure is kept in: `self.post(ids, tok)`). None when no
    function that ran calls it."""
    file, _, fn = site
    for r in ctx.steps[step]:
        for k, (code, _) in enumerate(r.stack):
            if ctx.trace.is_own(code) or (code.co_filename == file and code.co_name == fn) or \
                    not any(_calls(code, n) for n in (fn, *sorted(names))):
                continue
            own = [f for f in r.stack[:k] if ctx.trace.is_own(f[0])]
            if own:
                return own[-1][0].co_filename, own[-1][1], own[-1][0].co_name
    for code in {code for r in ctx.steps[step] for code, _ in r.stack if ctx.trace.is_own(code)}:
        line = _call_line(code, fn)  # the target calls it itself (`y = quiet(y)`, imported from the library)
        if line is not None:
            return code.co_filename, line, code.co_name
    return None


def _call_line(code, name: str) -> int | None:
    """The first line in the function of `code` that calls `name(...)` or `x.name(...)`."""
    node = function_node(code)
    lines = [n.lineno for n in ast.walk(node) if isinstance(n, ast.Call)
             and getattr(n.func, "attr", getattr(n.func, "id", None)) == name] if node is not None else []
    return min(lines) if lines else None


function_node = lookup.function_node


_CALLS_CACHE: dict = {}


def _calls(code, name: str) -> bool:
    """Whether the function of `code` calls `name(...)` or `x.name(...)` in its own body."""
    key = (id(code), name)
    if key not in _CALLS_CACHE:
        node = function_node(code)
        _CALLS_CACHE[key] = (code, node is not None and any(
            isinstance(n, ast.Call) and getattr(n.func, "attr", getattr(n.func, "id", None)) == name
            for n in ast.walk(node)))
    return _CALLS_CACHE[key][1]
