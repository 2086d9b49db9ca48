"""data-dependent-control: the steady-state steps ran different op sequences.

A graph is one recorded path. If step k and step k+1 dispatch different ops (a Python `if` on a
tensor value or a host counter, a loop whose trip count comes from data, a different expert
chosen), replay runs the captured path regardless. We align the op sequences of consecutive
steps (difflib on (op, module, source line) tokens), and for every region where they differ we
name the statement that chose: the branch separating the two executions in the source.
"""

from __future__ import annotations

import ast
import itertools
from collections import Counter, defaultdict
from difflib import SequenceMatcher

from torch import nn

from audit.detectors import register
from audit.detectors.branches import call_arms, control_source, fork_keys, later_exits, moved_hooks, other_instance, \
    size_tests
from audit.detectors.device import eager_forks
from audit.detectors.host import regions as _host_regions
from audit.detectors.source import lookup
from audit.detectors.branches.elided_slices import elided_slice
from audit.detectors.branches.layout_picks import picked_by_layout, without_prefix_views
from audit.detectors.branches.element_guards import element_guard


def _module_call_frame(ctx, a, b):
    """Same code ran for different module instances (which expert): the frame that called it."""
    pa, pb = a.module.split("."), b.module.split(".")
    i = 0
    while i < min(len(pa), len(pb)) and pa[i] == pb[i]:
        i += 1
    path = ".".join(pa[: i + 1])
    mods = {p or type(o).__name__: o for p, o in ctx.trace.objects if isinstance(o, nn.Module)}
    mod = mods.get(path)
    code = getattr(getattr(type(mod), "forward", None), "__code__", None) if mod is not None else None
    for k, (c, _) in enumerate(a.stack):
        if c is code and k > 0:
            return a.stack[k - 1]
    return None


def _at(code, line):
    return code.co_filename, line, code.co_name


def _same_path(a, b) -> bool:
    """Both executions at the same lines of the same code: only the module instance differs."""
    return len(a.stack) == len(b.stack) and all(fa[0] is fb[0] and fa[1] == fb[1] for fa, fb in zip(a.stack, b.stack))


def _decided(p, x, flags=None):
    """(file, line, function) of the branch that let `x` run after the anchor `p`, or None.

    x's frames are walked from where its path leaves p's, outermost first: in the first frame that
    differs, the branch between p's line and x's (a guard clause `if ...: continue` included);
    in frames p never entered, the branch between the function's start and x's line; in calls p was
    in and x has left, the branch that returned early."""
    ps = p.stack if p is not None else []
    left = False
    for d, (code, lx) in enumerate(x.stack):
        shared = not left and d < len(ps) and ps[d][0] is code
        if shared and ps[d][1] == lx and d < len(x.stack) - 1:
            if len(ps) == d + 1 and (line := lookup.decider(code.co_filename, lx, lx)) \
                    and not control_source.args_first(code.co_filename, lx, x.stack[d + 1][0].co_name):
                return _at(code, line)  # p's op ended that call: x's call is another loop iteration
            continue  # the same call in progress: the paths part deeper
        for pc, lp in reversed(ps[d + 1:] if shared else ()):  # x left calls p was in: how they returned
            if (line := lookup.exit_after(pc.co_filename, lp)):
                return _at(pc, line)
        line = lookup.decider(code.co_filename, ps[d][1] if shared else None, lx)
        # `if procs is not None: procs(ids, x)`
        if line and shared and control_source.presence_test(code.co_filename, line):
            inner = next(((c, found) for c, l in reversed(x.stack[d + 1:])
                          if (found := lookup.decider(c.co_filename, None, l))
                          and not control_source.held(c.co_filename, found, flags or {})), None)
            if inner is not None:  # the nearest decision, inside the call the optional object runs
                return _at(inner[0], inner[1])
        if line:
            return _at(code, element_guard(code.co_filename, line, lx) or line)
        left = True
    return None


def _parted_before(p, q):
    """The two steps' anchors are the same op reached along different paths (`match phase:` calling
    one helper from two lines, whose loop then runs another trip count; one line calling a function
    picked by a computed key): the executions had parted in an outer frame already, at the branch
    between those two lines, or at the pick. (file, line, function) or None."""
    if p is None or q is None:
        return None
    prev = None
    for (cp, lp), (cq, lq) in zip(p.stack, q.stack):
        if cp is not cq:  # one call line, two functions (`fn = {"a": self._a, "b": self._b}[mode]; fn(x)`): the pick
            line = lookup.picked_by(prev[0].co_filename, prev[1]) if prev is not None else None
            return _at(prev[0], line) if line else None
        if lp != lq:
            line = lookup.branch_between(cp.co_filename, lp, lq)
            return _at(cp, line) if line else None
        prev = (cp, lp)
    return None


def _skipped_in_loop(x, nxt, p=None):
    """One step ran extra ops `x` where the other went on with `nxt` from the same loop-body line (a
    processor loop whose `if p.enabled:` skipped one): the guard in that loop's body, from the deepest
    frame the two share at the same line; None when no such guard exists, or when `x` goes on, further
    down, in the call the anchor `p` was in (a processor's own `if ids.shape[-1] < self.min_length:`
    below that loop): the branch is inside that call, and both steps made it."""
    if x is None or nxt is None:
        return None
    shared = list(itertools.takewhile(lambda f: f[0][0] is f[1][0] and f[0][1] == f[1][1], zip(x.stack, nxt.stack)))
    d = len(shared)
    if p is not None and d < min(len(p.stack), len(x.stack)) and p.stack[:d] == x.stack[:d] \
            and p.stack[d][0] is x.stack[d][0] and x.stack[d][1] > p.stack[d][1]:
        return None
    for (code, line), _ in reversed(shared):
        if (guard := lookup.body_guard(code.co_filename, line)):
            return _at(code, guard)
    return None


def _picked_callee(p, x):
    """One step ran extra ops `x` with no branch around them, below a call of a callee picked by a computed key
    (`q = self.quantizers[self.kv_dtype]; q(k)`, one pick an `nn.Identity()` or `lambda x: x` that runs no op):
    the pick, in the innermost frame of `x` not shared with the anchor `p`; None when there is none."""
    shared = 0 if p is None else sum(1 for _ in itertools.takewhile(
        lambda f: f[0][0] is f[1][0] and f[0][1] == f[1][1], zip(p.stack, x.stack)))
    for code, line in reversed(x.stack[shared:]):
        if (pick := lookup.picked_by(code.co_filename, line)):
            return _at(code, pick)
    return None


def _parted_inside(a, b):
    """Both executions came through the same line into the same function and part inside it (a ring cache's
    `if full:` under the caller's `if cache is not None:`): the branch between their lines there, the
    innermost decision; an enclosing branch of the caller's, which both entered, decided nothing."""
    sa, sb = a.stack, b.stack
    i = 0
    while i < min(len(sa), len(sb)) and sa[i][0] is sb[i][0] and sa[i][1] == sb[i][1]:
        i += 1
    if 0 < i < min(len(sa), len(sb)) and sa[i][0] is sb[i][0]:
        line = lookup.branch_between(sa[i][0].co_filename, sa[i][1], sb[i][1])
        if line:
            return _at(sa[i][0], line)
    return None


def _next_instance(ctx, p, x):
    """The extra ops `x` run the same lines as the anchor `p` on another module instance (a cross network's
    `for layer in self.layers[: self.depth]: x = layer(x0, x)` running one more layer): the call of the
    module is another iteration of the caller's loop, whose trip count (or a guard in it) decided."""
    if p is None or p.module == x.module or not _same_path(p, x):
        return None
    fr = _module_call_frame(ctx, p, x)
    line = lookup.decider(fr[0].co_filename, fr[1], fr[1]) if fr else None
    return _at(fr[0], line) if line else None


def _reentered(p, x):
    """The extra ops `x` begin another call made from the line the anchor `p`'s call came from: of the
    function p ended in (a draft loop `for _ in range(self.k): logits, tok = self._one(tok)` running one
    more iteration; where the two part, x is at or before p's line in that function and no loop of it
    holds both), or of another function (a processor loop `for proc in active: logits = proc(ids, logits)`
    over a list filtered per request). The loop of the caller (or a guard in it) decided; callers that
    sit at the same line in both are walked outwards. (file, line, function) or None."""
    if p is None:
        return None
    depth = None
    for d, ((cp, lp), (cx, lx)) in enumerate(zip(p.stack, x.stack)):
        if cp is not cx:
            depth = d  # another function called from the same caller line
            break
        last = d == len(p.stack) - 1 or d == len(x.stack) - 1
        if lp == lx and not last:
            continue
        if lx > lp or lookup.decider(cx.co_filename, lp, lx):
            return None  # forward in the same call, or a loop inside the function: not a new call
        depth = d
        break
    for code, line in reversed(x.stack[:depth or 0]):
        found = lookup.decider(code.co_filename, line, line)
        if found or control_source.comprehension_at(code.co_filename, line):
            found = element_guard(code.co_filename, found, line) or found if found else None  # `if f.enabled:`
            return _at(code, found or line)  # a comprehension's iteration count (`[f(h, i) for i in range(k)]`)
    return None


def locate(ctx, p, a, b, q=None, nxt=None):
    """(file, line, function) of the statement where two executions part ways.

    p: the last op both ran (the anchor; q: the same op in the other step); a, b: the first ops that
    differ (None: nothing more ran); nxt: where one side went on when the other ran extra ops."""
    if (found := _parted_before(p, q)):
        return found
    if (a is None) != (b is None) and (found := call_arms.entered_callee(a or b, nxt)):
        return _at(*found)  # both steps made the call (an `if` calling it either way): its own branch decided
    if (a is None) != (b is None) and (found := _skipped_in_loop(a or b, nxt, p)):
        return found
    if (a is None) != (b is None) and (found := _next_instance(ctx, p, a or b)):
        return found
    if (a is None) != (b is None) and nxt is not None and other_instance.same_lines(a or b, nxt) \
            and (found := other_instance.chose_instance(_module_call_frame(ctx, a or b, nxt))):
        return found  # the other step went on with the same code on another expert: the caller chose
    if a is not None and b is not None and (found := _parted_inside(a, b)):
        return found
    if a is None or b is None or not _same_path(a, b):  # the same path: another module ran (below)
        for x in (a, b):
            if x is not None and (found := _decided(p, x, ctx.trace.flags)):
                return found
    if a is None or b is None:
        x = a or b
        if (found := _reentered(p, x)):
            return found
        code, line = x.stack[-1]
        branch = lookup.innermost_branch(code.co_filename, line)
        if branch is None and p is not None:  # the other side ran nothing more: it left a function early
            for d in range(min(len(p.stack), len(x.stack)) - 1, -1, -1):  # innermost shared frame first
                (pc, lp), (xc, lx) = p.stack[d], x.stack[d]
                if pc is xc and (found := lookup.exit_branch(pc.co_filename, lp, lx)):
                    return _at(pc, found)
        return (None if branch else _picked_callee(p, x)) or _at(code, branch or line)
    sa, sb = a.stack, b.stack
    i = 0
    while i < min(len(sa), len(sb)) and sa[i][0] is sb[i][0] and sa[i][1] == sb[i][1]:
        i += 1
    if i < len(sa) and i < len(sb) and sa[i][0] is sb[i][0]:
        line = lookup.branch_between(sa[i][0].co_filename, sa[i][1], sb[i][1])
        if line:
            return _at(sa[i][0], line)
    if p is not None and p.stack:  # one side left a function early: find the exiting branch
        for d in range(len(p.stack) - 1, -1, -1):
            code, lp = p.stack[d]
            la = sa[d][1] if d < len(sa) and sa[d][0] is code else None
            lb = sb[d][1] if d < len(sb) and sb[d][0] is code else None
            if (la is None) != (lb is None):
                line = lookup.exit_branch(code.co_filename, lp, la if la is not None else lb)
                if line:
                    return _at(code, line)
    if i == len(sa) == len(sb) and a.module != b.module:
        fr = _module_call_frame(ctx, a, b) or (sa[-1] if sa else None)  # else the call's own line
        if fr:
            file = fr[0].co_filename
            return _at(fr[0], lookup.chooser(file, fr[1]) or lookup.picked_by(file, fr[1]) or fr[1])
    code, line = (sa[i - 1] if 0 < i <= len(sa) else sa[-1])
    if 0 < i < len(sa) and i < len(sb) and sa[i][0] is not sb[i][0]:  # one call line, two functions:
        line = lookup.picked_by(code.co_filename, line) or line  # `fn = STRATEGIES[name]; fn(x)`
    return _at(code, line)


def _by_thread(recs: list) -> list:
    """The step's own ops, then each piece of work it handed to another thread, in the order it handed them
    over: work handed to a thread pool (a grammar bitmask filled while the forward runs, rows fanned out to
    workers) interleaves with the step's ops, and lands on one worker or another, differently from step to
    step, which is scheduling, not a path the data chose."""
    if not any(r.thread for r in recs):
        return recs
    return sorted(recs, key=lambda r: r.thread)  # stable: each task's own ops keep their order


@register("data-dependent-control")
def op_sequence_divergence(ctx):
    """Consecutive complete steps dispatched different op sequences: replay would run only one."""
    steps = ctx.complete
    if len(steps) < 2:
        return []
    ids: dict = {}
    seqs = {}
    for s in steps:
        recs = without_prefix_views(_by_thread([r for r in ctx.ops(s) if r.stack]))
        seqs[s] = (recs, [ids.setdefault((r.op, r.module, id(r.stack[-1][0]), r.stack[-1][1]), len(ids))
                          for r in recs])
    hits = defaultdict(list)
    for s0, s1 in itertools.pairwise(steps):
        (ra, ta), (rb, tb) = seqs[s0], seqs[s1]
        if ta == tb:
            continue
        pair = []
        if (hooks := moved_hooks.moved(ctx, s0, s1)):  # a hook registered on other modules: its ops moved
            (ra, ta, x0), (rb, tb, x1) = (moved_hooks.split(r, t, hooks) for r, t in ((ra, ta), (rb, tb)))
            if (x := x0 or x1) is not None:
                code, line = moved_hooks.hook_frame(x, hooks)
                what = moved_hooks.message(code, hooks[code], s0, s1)
                pair.append(((code.co_filename, line, code.co_name), [what, x.op, x.module, x],
                             [x.frame] if x.frame else []))
        codes = [c for c in SequenceMatcher(None, ta, tb, autojunk=False).get_opcodes() if c[0] != "equal"]
        shifted = _shifted_regions(ta, tb, codes)
        for tag, i1, i2, j1, j2 in codes:
            if elided_slice(tag, ra, rb, i1, i2, j1, j2) or picked_by_layout(tag, ra, rb, i1, i2, j1, j2) \
                    or (i1, j1) in shifted or _host_regions.host_work_only(ctx, ra[i1:i2], rb[j1:j2]):
                continue  # (the last: CPU work on host memory alone, which no graph records)
            a = ra[i1] if i1 < len(ra) and tag != "insert" else None  # an insert's ra[i1] is the op after it:
            b = rb[j1] if j1 < len(rb) and tag != "delete" else None  # not part of the difference
            p = ra[i1 - 1] if i1 > 0 else None
            q = rb[j1 - 1] if j1 > 0 else None
            if a is None and b is None:
                continue
            what = _what(ctx, tag, s0, s1, ra[i1:i2], rb[j1:j2], a, b)
            if a is not None and b is not None and ta[i1] == tb[j1]:
                # an extra (or missing) loop iteration: the alignment can start it anywhere, so
                # attribute the extra ops to the loop/branch around them
                a, b = (a, None) if tag == "delete" else (None, b)
            first = sorted({x.op for x in (ra[i1:i2][:1] + rb[j1:j2][:1])})  # sorted: stable across runs
            nxt = (rb[j1] if j1 < len(rb) else None) if tag == "delete" else \
                (ra[i1] if i1 < len(ra) else None) if tag == "insert" else None
            where = _mode_switched(locate(ctx, p, a, b, q, nxt), a or b)
            if size_tests.decided_by_sizes(ctx, where, a or b, s0, s1):
                continue  # a branch on sizes: one path per shape, downstream of the dynamic shape
            heads = [x.frame for x in ra[i1:i2][:1] + rb[j1:j2][:1] if x.frame]
            pair.append((where, [what, " vs ".join(first), (a or b).module, a or b], heads))
            extra = ra[i1:i2] if tag == "delete" else rb[j1:j2] if tag == "insert" else []
            if (later := later_exits.later_exit(where, extra, nxt)):  # `if not emit: return` after `if emit:`
                x = extra[later[0]]
                pair.append((later[1], [_what(ctx, tag, s0, s1, extra[later[0]:], extra[later[0]:], x, x), x.op,
                                        x.module, x], [x.frame] if x.frame else []))
        eagers = eager_forks.eager_only([(w, ctx.caller(r[3]), h, ctx.caller_into(r[3], w[0], w[2]) is None)
                                          for w, r, h in pair], ctx.rel)
        for (where, region, _), eager in zip(pair, eagers):
            hits[(where, fork_keys.caller_key(ctx, region[3], where))].append((*region, eager))
    fork_keys.fold_loops_into_guards(ctx, hits)
    out = []
    n_pairs = len(steps) - 1
    for (where, _), regions in hits.items():
        what, ops, mod, rec, eager = regions[0]
        msg = f"{what}; a graph replays only the captured path"
        eager = eager if all(r[4] for r in regions) else None  # every fork here follows an eager-only one
        out.append(ctx.finding("data-dependent-control", where, ops, len(regions) / n_pairs,
                               msg + (eager_forks.message(eager) if eager else ""), module=mod,
                               severity="info" if eager else None, caller=ctx.caller_into(rec, where[0], where[2])))
    return out


def _shifted_regions(ta, tb, codes) -> set:
    """(i1, j1) of the differing regions whose ops both steps ran equally often: the alignment shifted them
    (a per-frame loop `for t in range(T): step(frames[:, t])` whose inner loop runs one more trip in one step
    lines up its frames' `select`s against the other's extra trips), while the other regions, where the counts
    differ, are the real difference. When every region keeps the counts (the steps ran the same ops in
    another order) none is dropped."""
    ca, cb = Counter(ta), Counter(tb)
    same = {(c[1], c[3]) for c in codes if all(ca[t] == cb[t] for t in ta[c[1]:c[2]] + tb[c[3]:c[4]])}
    return same if len(same) < len(codes) else set()


_MODES = ("autocast", "set_grad_enabled", "inference_mode", "set_autocast_enabled")


def _mode_switched(where, x):
    """A region blamed on its own op's line (no branch chose it) that runs inside a `with` entering a
    dispatch mode by a computed flag (`torch.autocast("cuda", enabled=self.amp)`,
    `torch.set_grad_enabled(flag)`): the same lines ran in both steps, but the flag chose which ops
    (casts) they dispatch, so that `with` is the branch a person has to change."""
    code, line = x.stack[-1]
    if where != _at(code, line):
        return where
    func = lookup.enclosing_function(code.co_filename, line)
    withs = [n.lineno for n in ast.walk(func) if isinstance(n, (ast.With, ast.AsyncWith)) and n.body
             and n.body[0].lineno <= line <= (n.end_lineno or n.lineno)
             and any(_switched(i.context_expr) for i in n.items)] if func is not None else []
    return _at(code, max(withs)) if withs else where


def _switched(e) -> bool:
    """`autocast(..., enabled=<not a constant>)`, `set_grad_enabled(<not a constant>)` and the like."""
    if not isinstance(e, ast.Call):
        return False
    name = e.func.attr if isinstance(e.func, ast.Attribute) else getattr(e.func, "id", "")
    if name not in _MODES:
        return False
    flags = [k.value for k in e.keywords if k.arg in ("enabled", "mode")]
    if name != "autocast" and e.args:
        flags.append(e.args[-1])
    return any(not isinstance(f, ast.Constant) for f in flags)




def _what(ctx, tag, s0, s1, extra_a, extra_b, a, b) -> str:
    if tag == "delete":
        return f"step {s0} ran {len(extra_a)} op(s) that step {s1} did not (first {_desc(ctx, extra_a[0])})"
    if tag == "insert":
        return f"step {s1} ran {len(extra_b)} op(s) that step {s0} did not (first {_desc(ctx, extra_b[0])})"
    return f"the op sequence forks between steps {s0} and {s1}: {_desc(ctx, a)} vs {_desc(ctx, b)}"


def _desc(ctx, r) -> str:
    if r is None:
        return "nothing more"
    f, line, _ = ctx.where(r)
    return f"`{r.op}` at {f}:{line}" + (f" ({r.module})" if r.module else "")
