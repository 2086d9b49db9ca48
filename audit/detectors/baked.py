"""baked-host-value and dynamic-shape: the same call gets different host values or shapes per step.

A graph stores each kernel's scalar arguments and launch geometry. We align calls across the
complete steady-state steps (module path, source line, op, occurrence) and diff them:
- output shape differs: dynamic-shape, reported where the variation starts (no input shape
  varied, a varying input came from outside this step, or steps with equal input shapes got other host
  values and other output shapes: the call's own bound moves), not on every op downstream of it;
- input shapes equal but non-tensor arguments differ (a Python position, a slice bound, a scalar
  operand, a view / arange / zeros size, `torch.tensor(pos)` data): baked-host-value, wherever the
  value enters. When it also sets the output's shape (`buf[:n]`, `arange(n)`), both findings stand,
  each with its own fix: the value goes to a device tensor, the shape to a static maximum.
  Calls whose input shapes already vary are left to dynamic-shape, unless steps with the same input
  shapes got different values (then a host value is baked as well); their sizes follow the shapes
  (and a misaligned call of one line reads as changed arguments too).
"""

from __future__ import annotations

import math
from collections import defaultdict

from audit.detectors import register
from audit.detectors.tensors import carried_shapes, composite_layouts, counter_bounds, outside_inputs, read_sizes, \
    read_values
from audit.detectors.host import host_only, kept_arrays
from audit.detectors.tensors.forwarded import forwarded
from audit.detectors.branches.skipped_iterations import diverged as _diverged, skipped_iteration
from audit.detectors.host.kept import advanced, host_tensors
from audit.detectors.tensors.skipped_subscripts import skipped_subscripts


def _aligned(ctx):
    """key -> [record per complete step], for calls present in at least two complete steps."""
    per = defaultdict(list)
    for s in ctx.complete:
        for key, r in ctx.sites(s).items():
            per[key].append(r)
    return {k: v for k, v in per.items() if len(v) >= 2}


def _shapes(metas):
    return tuple(tuple(m.shape) for m in metas)


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, tuple):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    return str(v)


def _show(values, limit: int = 4) -> str:
    """The values step by step; a run of one value that fills the first `limit` steps (a bound that moves once
    every few positions) is named once with its length, so the change itself is shown."""
    vals = [_fmt(v) for v in values]
    run = next((i for i in range(1, len(vals)) if vals[i] != vals[0]), len(vals))
    if run >= limit and run < len(vals):
        vals = [f"{vals[0]} ({run} steps)"] + vals[run:]
    s = " -> ".join(vals[:limit])
    return s + (" -> ..." if len(vals) > limit else "")


def _arg_diff(recs) -> str:
    args = [r.args for r in recs]
    if all(len(a) == len(args[0]) for a in args):
        for i in range(len(args[0])):
            col = [a[i] for a in args]
            if len(set(map(repr, col))) > 1:
                if args[0] and args[0][0] == "value":
                    return f"a tensor built from host data (torch.tensor, as_tensor, from_numpy, frombuffer) changes every step: {_show(col)}"
                name = f"`{col[0][0]}=`" if isinstance(col[0], tuple) and len(col[0]) == 2 and isinstance(col[0][0], str) \
                    else f"argument {i}"
                vals = [c[1] if name.startswith("`") else c for c in col]
                return f"{name} changes between steps: {_show(vals)}"
    return f"arguments change between steps: {_show(args, 2)}"


@register("dynamic-shape")
def varying_shapes(ctx):
    """A call's output shape changes between steps: replay would compute on the captured shape."""
    groups, plan = defaultdict(list), []
    aligned, inner = _aligned(ctx), forwarded(ctx)
    for recs in aligned.values():
        outs = [_shapes(r.outputs) for r in recs]
        if len(set(outs)) < 2 or (recs[0].step, recs[0].index) in inner:
            continue  # (a subclass's dispatch forwarding the op to its data: the wrapper's call reports it)
        ins = [_shapes(r.inputs) for r in recs]
        varying = [j for j in range(len(recs[0].inputs))
                   if len({s[j] if j < len(s) else None for s in ins}) > 1]
        outside = outside_inputs.outside_varies(recs, varying)
        plan.append((recs, outs, varying, outside))
    makers, memo = carried_shapes.makers(plan), {}
    for gid, (recs, outs, varying, outside) in enumerate(plan):
        origin = not varying or _host_sized(recs) or \
            (outside and not carried_shapes.carried_from_earlier_step(ctx, recs, varying, makers, gid, memo)) or \
            (not outside and carried_shapes.grows_own_output(ctx, recs, varying, makers, gid, memo)) or \
            counter_bounds.own_counter_bound(ctx, recs)  # `topk(min(k, end_pos // r))` on a varying score
        if origin and recs[0].op in _LIFTS and host_only.stays_on_host(ctx, recs):
            continue  # host data of a changing length, read back on the host alone: no kernel's shape
        if origin and host_only.host_work_stays(ctx, recs):
            continue  # CPU work on host data (a host factory's grid) that never reaches the device
        if origin and host_only.shape_stays_on_host(ctx, recs):
            continue  # host data of a changing length that meets the device only in a fixed shape (a densified row)
        if origin and read_sizes.follows_varying_shape(ctx, recs, aligned):
            continue  # `torch.ones(e.size(1))` after `e = e[:, mask]`: the shape varied upstream
        if origin and composite_layouts.follows_operand_layout(ctx, recs):
            continue  # einsum's permute of an unchanged operand, picked from another operand's varying size
        if origin:
            groups[ctx.site_key(recs[0])].append((recs, outs))
    reshaped = None
    out = []
    for ((file, line, fn), op, _), items in groups.items():
        recs, outs = items[0]
        if any(r.note.startswith("body:") for rs, _ in items for r in rs):
            reshaped = _changed(ctx, shapes_only=True) if reshaped is None else reshaped
            if any(_returns_body_shape(ctx, r, reshaped) for rs, _ in items for r in rs):
                continue  # a custom op whose traced body makes the varying shape: reported there, this call as caller
        shown = [list(s[0]) if len(s) == 1 else [list(x) for x in s] for s in outs]
        msg = f"output shape changes between steps: {_show(shown)}"
        out.append(ctx.finding("dynamic-shape", recs[0], op, len(items), msg))
    return out + skipped_subscripts(ctx, set(groups))


def _host_sized(recs) -> bool:
    """Whether steps that saw the same input shapes got other host values and other output shapes: the call sizes
    its output from a host value of its own (`keys = pool[bt].reshape(-1, H, D)[: pos + 1]` on a table that grows
    every few steps, `pos` a Python counter), not only from the varying input it slices. The variation starts here
    too: a static table would still leave this bound moving, so it is an origin beside the input's."""
    by_shape = defaultdict(list)
    for r in recs:
        by_shape[_shapes(r.inputs)].append(r)
    return any(len(g) > 1 and len({r.args for r in g}) > 1 and len({_shapes(r.outputs) for r in g}) > 1
               for g in by_shape.values())


_LIFTS = ("aten.lift_fresh", "aten.lift_fresh_copy")
# torch.profiler's record_function enter / exit: host-side annotations, no kernel and no kernel argument (a replay
# runs none of them, so a label that changes per step only labels the capture's profile)
_ANNOTATIONS = "profiler."
SHAPE_FIX = ("Keep the value in a device tensor that prepare() updates in place and use it as data, not as a "
             "size or bound: slice / arange / allocate the static maximum and mask with the device value "
             "(the dynamic-shape finding on this line has the shape's fix).")


def _body_of(r) -> list:
    """(step, index) of the records a custom op's traced Python body ran (none for any other op)."""
    if not r.note.startswith("body:"):
        return []
    return [(r.step, j) for j in range(int(r.note[5:]), r.index)]


def _returns_body_shape(ctx, r, reshaped: set) -> bool:
    """The call returns the very tensor an op of its traced body made with a varying shape (a custom op's
    `torch.nonzero`): not a wrapper a subclass's dispatch builds around its data (`Edges(out)`), whose shape is
    the wrapper call's own."""
    mine = {m.sid for m in r.outputs}
    for s, j in _body_of(r):
        b = ctx.steps[s][j] if (s, j) in reshaped and j < len(ctx.steps[s]) else None
        if b is not None and b.index == j and mine & {m.sid for m in b.outputs}:
            return True
    return False


def _changed(ctx, shapes_only: bool = False) -> set:
    """(step, index) of the calls whose arguments (unless `shapes_only`) or output shapes differ between the
    complete steps."""
    return {(r.step, r.index) for recs in _aligned(ctx).values()
            if (not shapes_only and len({r.args for r in recs}) > 1) or len({_shapes(r.outputs) for r in recs}) > 1
            for r in recs}


@register("baked-host-value")
def varying_host_values(ctx):
    """Input shapes equal, non-tensor arguments differ: capture freezes the first step's value
    (also when the value sets the output shape: then dynamic-shape reports the shape as well)."""
    groups = defaultdict(list)
    diverged, memo = None, {}
    aligned = _aligned(ctx)
    for recs in aligned.values():
        if len({r.args for r in recs}) < 2 or recs[0].op.startswith(_ANNOTATIONS):
            continue  # (a profiler label, `record_function(f"ProfilerStep#{n}")`, is no kernel argument)
        diverged = _diverged(ctx) if diverged is None else diverged
        if diverged and skipped_iteration(ctx, recs[0], memo):
            continue
        if len({_shapes(r.inputs) for r in recs}) > 1:
            # sizes that follow a varying input shape are dynamic-shape's, at the shape's origin; but
            # steps that saw the same input shapes and still got different values baked a host value
            # (a cache that grows now and then, indexed with a Python position)
            by_shape = defaultdict(list)
            for r in recs:
                by_shape[_shapes(r.inputs)].append(r)
            recs = next((g for g in by_shape.values() if len(g) > 1 and len({r.args for r in g}) > 1), None)
            if recs is None:
                continue
        if recs[0].args and recs[0].args[0] == "value" and host_only.stays_on_host(ctx, recs):
            continue  # built from host data and read back on the host alone: no kernel takes it
        if recs[0].op in _LIFTS and kept_arrays.sent_as_is(ctx, recs):
            continue  # a kept numpy array's wrap, sent as it is: the copy reads its memory (host/kept_arrays.py)
        if host_only.host_work_stays(ctx, recs):
            continue  # CPU work on host data that never reaches the device: no kernel takes the value
        if read_sizes.follows_varying_shape(ctx, recs, aligned):
            continue  # the value is a size read off a tensor whose shape varies: dynamic-shape's, upstream
        if composite_layouts.follows_operand_layout(ctx, recs):
            continue  # a composite's layout op, picked from another operand's varying size (tensors/composite_layouts.py)
        if read_values.read_back_on_line(ctx, recs):
            continue  # torch read it back from a 0-dim device tensor for the op: the host-sync's (tensors/read_values.py)
        groups[ctx.site_key(recs[0])].append(recs)
    changed = _changed(ctx)
    out = []
    for ((file, line, fn), op, _), items in groups.items():
        recs = items[0]
        if any(j in changed for rs in items for r in rs for j in _body_of(r)):
            continue  # a custom op whose traced body bakes the value: reported there, with this call as caller
        if host_only.lifts_on_host(ctx, items):
            continue  # host data only host code reads: no device op takes the value (host/host_only.py)
        msg = _arg_diff(recs)
        fix = None
        if recs[0].args and recs[0].args[0] == "value":
            fix = ("Do not build tensors from Python values inside the step: keep a device tensor "
                   "(e.g. the position) that prepare() updates in place, and compute from it.")
        elif any(len({_shapes(r.outputs) for r in rs}) > 1 for rs in items):
            msg += "; the value also sets the output shape (see dynamic-shape)"
            fix = SHAPE_FIX
        out.append(ctx.finding("baked-host-value", recs[0], op, len(items), msg, fix=fix or ""))
    return out


@register("baked-host-value")
def host_scalar_operands(ctx):
    """A 0-dim host tensor computed in the step from a host counter the step advances (`decay = 0.9 **
    self.steps_cpu`) and used as an operand of a device op (`h * decay`): the op reads it as a kernel
    scalar, so a graph keeps the value of the capture step."""
    live0 = advanced(ctx, host_tensors(ctx))
    if not live0:
        return []
    hits, source = [], {}
    for recs in ctx.steps:
        live = dict(live0)  # storage id -> the advanced host tensor it derives from
        for r in recs:
            if r.kind != "aten" or r.nested or not r.inputs:
                continue
            mine = [m for m in r.inputs if m.sid in live]
            if not mine:
                continue
            device = [m for m in r.inputs if m.sid not in live and (m.device.type != "cpu" or not ctx.cuda)]
            if not device:  # host arithmetic on the counter: its small results are host scalars too
                live.update((m.sid, live[mine[0].sid]) for m in r.outputs if math.prod(m.shape) <= 64)
            elif not r.op.endswith("_") or r.inputs[0].sid not in live:
                scalars = [m for m in mine if not m.shape]
                if scalars:
                    hits.append(r)
                    source[id(r)] = live[scalars[0].sid]
    return [ctx.finding("baked-host-value", g[0], op, len(g) / ctx.n_steps,
                        f"`{op}` takes a 0-dim host tensor derived from `{source[id(g[0])]}`, which the step "
                        "advances, as a scalar operand: the kernel gets its value at launch, so a graph replays "
                        "the value of the capture step",
                        fix="Keep the counter on the device (a 0-dim device tensor updated in place in the step), so "
                            "the kernel reads it from memory on every replay.")
            for (_, _, op, _), g in ctx.per_site(hits).items()]


@register("baked-host-value")
def host_scalar_values(ctx):
    """A 0-dim tensor the target keeps on the host (`self.temp = torch.tensor(1.0, device="cpu")`) is an
    operand of a device op and holds another value each step (prepare() anneals it, the step advances
    it): the kernel gets it as a scalar at launch, so a graph replays the capture step's value."""
    host = host_tensors(ctx)
    if not host:
        return []
    stepped = advanced(ctx, host)  # advanced inside the step: host_scalar_operands follows those
    groups = defaultdict(list)
    for recs in _aligned(ctx).values():
        r = recs[0]
        mine = [i for i, _ in r.host_scalars if r.inputs[i].sid in host and r.inputs[i].sid not in stepped]
        device = [m for m in r.inputs if m.sid not in host and (m.device.type != "cpu" or not ctx.cuda)]
        if not mine or not device:
            continue
        values = [dict(x.host_scalars).get(mine[0]) for x in recs]
        if len(set(map(repr, values))) > 1:
            groups[ctx.site_key(r)].append((recs, host[r.inputs[mine[0]].sid], values))
    return [ctx.finding("baked-host-value", items[0][0][0], op, len(items),
                        f"`{op}` takes the 0-dim host tensor `{items[0][1]}` as a scalar operand and its value "
                        f"changes between steps ({_show(items[0][2])}): the kernel gets the value at launch, so "
                        "a graph replays the value of the capture step",
                        fix="Keep the value in a 0-dim device tensor that prepare() (or the step) updates in place: "
                            "the kernel then reads it from memory on every replay.")
            for (_, op, _), items in groups.items()]
