"""host-sync the run could not see: waits in device-guarded branches a CPU scan never takes.

`if x.is_cuda: torch.cuda.synchronize()` runs nothing on the CPU, so a CPU scan traces no wait,
yet on the GPU that branch runs inside the captured region and capture fails. For every user
function the step ran, we read its source and report the synchronizing calls inside an `if`
that tests the device whose branch ran no op during the scan; in an installed library's functions
only the side the test itself says a GPU runs (`x.is_cuda`, `dev.type == "cuda"`: device/cuda_side.py). The test is read structurally
(scopes.device_test): `x.device != torch.device("cpu")`, `x.is_cuda`, `torch.cuda.*()`, or a flag
assigned such a test (`self.on_accelerator = device != "cpu"`); a test on ordinary data is not one. A read of a
name holding host data (`int(lengths.max())` with `lengths` built by `torch.tensor(...)`, in the function or by every
caller in the file: host/host_args.py) waits for nothing.
CUDA scans skip this rule: there the branch either ran (and was traced) or is not taken.
"""

from __future__ import annotations

import ast
import functools
import inspect

from audit.detectors import register
from audit.detectors.device import callee_waits, capture_guards, flag_reach
from audit.detectors.host import host_args
from audit.detectors.state import handoff
from audit.detectors.source import lookup, scopes
from audit.detectors.device.device_branches import guards as _guards
from audit.detectors.device.cuda_side import cuda_side
from audit.scan.patches import dist_hooks
from audit.scan.sources.user_code import LIBRARY, frame_kind

SYNC_CALLS = {"synchronize", "item", "tolist", "cpu", "numpy", "query", "elapsed_time", "empty_cache",
              *dist_hooks.HOST_WAITS}  # torch.distributed's: barrier(), the object collectives, is_completed()
# `int(lens.max())`: a Python number made from a tensor reduction reads it back
_REDUCTIONS = {"max", "min", "sum", "mean", "amax", "amin", "argmax", "argmin", "any", "all", "norm", "prod",
               "count_nonzero"}


# a CUDA-graph capture begun there: it synchronizes first, and nests in the step's own capture
_CAPTURES = ("cuda.graph", "cuda.graphs.graph", "make_graphed_callables", "capture_begin")


def _sync_call(call) -> str | None:
    """The synchronizing callee of a call, as written (`torch.cuda.synchronize`, `int`), else None."""
    if not isinstance(call, ast.Call):
        return None
    if isinstance(call.func, ast.Attribute) and call.func.attr in SYNC_CALLS:
        return ast.unparse(call.func)
    if isinstance(call.func, (ast.Attribute, ast.Name)) and ast.unparse(call.func).endswith(_CAPTURES):
        return ast.unparse(call.func)
    if isinstance(call.func, ast.Name) and call.func.id in ("int", "float", "bool") and len(call.args) == 1:
        a = call.args[0]
        if isinstance(a, ast.Call) and isinstance(a.func, ast.Attribute) and a.func.attr in _REDUCTIONS:
            return call.func.id
    return None


def _guarded(file: str, test: ast.AST, *, line: int) -> bool:
    """Whether the `if` test picks a side by device (so a CPU scan only ever runs one side)."""
    tree = lookup.tree(file)
    return tree is not None and (scopes.device_test(tree, test) or cuda_side(test, _resolver(file, line), file=file) is not None)


def _resolver(file: str, line: int):
    """The assignments a name or `self.attr` read on `line` can see (for `s is not None` tests)."""
    tree = lookup.tree(file)
    return lambda expr: scopes.values(tree, expr, line) if tree is not None else None


def _in_test(node: ast.If, file: str):
    """The operands of an `a and b and ...` test that run only where a GPU is: those after a prefix that
    holds on CUDA alone (`if x.is_cuda and not stream.query():`, `if s is not None and s.query():`)."""
    if not isinstance(node.test, ast.BoolOp) or not isinstance(node.test.op, ast.And):
        return []
    vals = node.test.values
    for i in range(1, len(vals)):
        prefix = ast.BoolOp(op=ast.And(), values=vals[:i]) if i > 1 else vals[0]
        if cuda_side(prefix, node.resolve, node.known, file) == "body":
            return vals[i:]
    return []


def _ran(ctx) -> tuple[dict, set]:
    """The functions the step ran (by file and first line: their name, and for an installed library's a
    record that ran inside it, for the caller) and the (file, line) pairs that dispatched an op."""
    funcs, lines = {}, set()
    for s in ctx.complete:
        for r in ctx.steps[s]:
            for code, line in r.stack:
                if ctx.trace.is_own(code):
                    funcs[(code.co_filename, code.co_firstlineno)] = (code.co_name, None)
                elif frame_kind(code.co_filename, ctx.trace.roots) == LIBRARY:
                    funcs.setdefault((code.co_filename, code.co_firstlineno), (code.co_name, r))
                lines.add((code.co_filename, line))
    for (file, first), (name, rec) in list(funcs.items()):
        # the library functions called unconditionally by the target's own function, or by a library function
        # that ran ops (a helper `_maybe_sync(x)` running none), with the target's line that led there as caller
        via = (file, None, name) if rec is None else ctx.caller_into(rec, file, name)
        for call, code in _direct_library_calls(ctx, file, first, name) if isinstance(via, tuple) else ():
            funcs.setdefault((code.co_filename, code.co_firstlineno),
                             (code.co_name, (file, call.lineno, name) if rec is None else via))
    return funcs, lines


def _direct_library_calls(ctx, file: str, first: int, name: str):
    """(call, code) for the calls in the top-level statements of an own function that ran (so they ran
    too) of an installed library's function (`flush_profiler()`, which ran no op and left no frame)."""
    func = lookup.enclosing_function(file, first + 1)
    if func is None or getattr(func, "name", None) != name:
        return
    for st in func.body:
        if isinstance(st, (ast.If, ast.While, ast.For, ast.Try, ast.Match, ast.Return)):
            continue  # a branch or loop may not have run it
        entered = {id(i.context_expr) for w in ast.walk(st) if isinstance(w, (ast.With, ast.AsyncWith)) for i in w.items}
        for call in (n for n in ast.walk(st) if isinstance(n, ast.Call)):
            for code in _codes(handoff.resolve(file, call.func), id(call) in entered):
                if frame_kind(code.co_filename, ctx.trace.roots) == LIBRARY:
                    yield call, code


def _codes(obj, entered: bool) -> list:
    """The code a call of `obj` runs: a function's; a class's `__init__`, and when the call is a `with` item
    (`with Timer():`) its `__enter__` and `__exit__`, which the syntax runs with no call naming them."""
    names = ("__init__", "__enter__", "__exit__") if entered else ("__init__",)
    fns = [inspect.getattr_static(obj, n, None) for n in names] if isinstance(obj, type) else [obj]
    return [c for f in fns if (c := getattr(inspect.unwrap(f) if callable(f) else None, "__code__", None)) is not None]


def _untaken(node: ast.If, file: str, lines: set, library: bool):
    """(side, statements) of whichever side of `node` ran no op in the scan (and could run under capture);
    in library code only the side the test itself says a GPU runs (device/cuda_side.py), with the plain flags the
    scan read at their values (`if self.timing and x.is_cuda:`)."""
    expr = getattr(node, "expr", False)  # a conditional expression: its sides share lines with other code
    want = cuda_side(node.test, node.resolve, node.known, file) if library or expr else None
    if expr and not library and want is None and (held := node.seen(node.test)) is not None:
        want = "orelse" if held else "body"  # a device flag of the target's (`self.on_gpu`): the side not taken here
    if (library or expr) and want is None:
        return
    for side, body, safe in zip(("body", "orelse"), (node.body, node.orelse), capture_guards.skipped_under_capture(node.test, file)):
        if body and not safe and (want is None or side == want) and (expr or not any(
                (file, n) in lines for st in body for n in range(st.lineno, (st.end_lineno or st.lineno) + 1))):
            yield side, body


def untaken_sides(ctx) -> list:
    """On a CPU scan, for each device branch of code the step ran: (file, function name, caller, the `if` node,
    the statements of its side(s) this scan did not take and a GPU would run). Read once per scan: the guarded
    host-sync and stream rules both walk them."""
    if (cached := getattr(ctx, "_untaken_sides", None)) is None:
        cached = ctx._untaken_sides = list(_untaken_sides(ctx))
    return cached


def _untaken_sides(ctx):
    funcs, lines = _ran(ctx)
    for (file, first), (name, rec) in funcs.items():
        func = lookup.enclosing_function(file, first + 1)
        if func is None or getattr(func, "name", None) != name:
            continue
        caller = rec if isinstance(rec, tuple) or rec is None else ctx.caller_into(rec, file, name)
        for node in _guards(func):
            node.resolve = _resolver(file, node.lineno)
            is_device = functools.partial(_guarded, file, line=node.lineno)
            node.known = flag_reach.known(lookup.tree(file), file, node.lineno, ctx.trace.flags, is_device)
            node.seen = functools.partial(flag_reach.seen, file, node.lineno, ctx.trace.flags)
            def reached(side, node=node, is_device=is_device):  # no flag on the way held the other value
                return not flag_reach.blocking_flag(lookup.tree(file), func, node, side, file, ctx.trace.flags, is_device)
            sides = _untaken(node, file, lines, rec is not None) if is_device(node.test) else ()
            sts = [st for side, body in sides if reached(side) for st in body]
            sts += _in_test(node, file) if reached("body") else []
            if sts:
                yield file, name, caller, node, sts


def found_in_untaken_sides(ctx, pick, keep=lambda file, call: True):
    """(file, line, function, what, via, branch node, caller) of each call `pick` names (`pick(call)` -> its name or
    None) in the device-guarded sides of code the step ran that a CPU scan did not take, and in the helpers those
    sides call; each line once. `via` says how the branch reached a helper's line ("" on the branch's own)."""
    seen = set()
    for file, name, caller, node, sts in untaken_sides(ctx):
        own = [(file, call.lineno, name, what) for st in sts for call in ast.walk(st)
               if (what := pick(call)) and keep(file, call)]
        for wfile, line, fname, what in [*own, *callee_waits.waits_below(file, sts, pick, ctx.trace.roots)]:
            if (wfile, line) in seen:
                continue
            seen.add((wfile, line))
            via = "" if wfile == file and fname == name else \
                f" in `{fname}()`, called from line {node.lineno} of `{name}()`,"
            yield wfile, line, fname, what, via, node, caller


@register("host-sync")
def syncs_in_untaken_device_branches(ctx):
    """On a CPU scan: synchronizing calls in device-guarded branches of code the step ran."""
    if ctx.cuda:
        return []
    keep = lambda file, call: not host_args.reads_host(file, call)  # noqa: E731
    return [ctx.finding(
        "host-sync", (wfile, line, fname), what, 0.0,
        f"`{what}()`{via} {'in' if via else 'sits in'} a branch guarded by `{ast.unparse(node.test)}` "
        "that this CPU scan did not take; on the GPU it waits for the device inside the step "
        "(found in the source, not traced)",
        fix="Remove the wait from the step, or move it outside the captured region.",
        caller=caller) for wfile, line, fname, what, via, node, caller in found_in_untaken_sides(ctx, _sync_call, keep)]
