"""Sizes read off a tensor whose shape already varies: downstream of a dynamic shape, not a new origin.

PyG's `gcn_norm` drops self loops with `edge_index[:, mask]` (a data-dependent edge count), then makes the
edge weights with `torch.ones((edge_index.size(1),), device=...)`. The factory takes no tensor, so its
output shape varied with no varying input, and it read as a second origin: a dynamic-shape and a
baked-host-value at a line whose only fix is the first one. A call is downstream when its statement reads a
size (`t.size(d)`, `t.shape`, `t.numel()`, `len(t)`) and, in every audited step, each output size that
changes equals one dimension (the same one each step) of an earlier call's output in that step whose shape
varies too; each size on its own (a position table interpolated to `(H, W)` read off an image's patch grid
follows two dimensions, the height's and the width's). The steps compared may be a few of them: baked's check takes the steps with equal inputs alone (timm's EVA rotary grid expands `arange(h)` to `(h, w)`, and two crops of one height differ in w only), and the earlier call is matched in those steps. Both conditions: a Python counter that happens to grow with a cache (`torch.arange(self.pos)`)
reads no size, and stays a baked value where it enters. A value that comes in through a parameter is followed
to the caller's statement that passed it (`gcn_norm(ei, w, x.size(0))` -> `torch.arange(0, N)` two calls down).
A size read mixed with a host counter is no such read: `t = ids.shape[0]; end = self.length + t;
torch.ones(t, end)` (a speculative decoder's causal mask over a cache filled up to a Python length) varies with
`self.length`, a plain number the step changed or prepare() set, and a fix of the earlier
varying call (`self.k_cache[:end]`) leaves it varying: it is an origin of its own (`counter_attrs`).
"""

from __future__ import annotations

import ast
from collections import defaultdict

from audit.detectors.source import assign_targets, grown_containers
from audit.detectors.tensors import passed_counters, restored_dims
from audit.detectors.tensors.size_reads import (  # noqa: F401 (size_tests reads them here)
    _ARITH_MODULES, _attrs_read, _bound, _is_size_read, _tensor_made)
from audit.detectors.source.lookup import enclosing_function, tree
from audit.scan.sources.ast_nodes import all_nodes

_META = {"device", "dtype", "layout", "is_cuda", "is_cpu", "ndim", "T", "mT", "data", "requires_grad"}  # a tensor's


def _statement(filename: str, line: int):
    t = tree(filename)
    best = None
    for n in all_nodes(t) if t is not None else ():
        if isinstance(n, ast.stmt) and not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                                                          ast.If, ast.For, ast.While, ast.With, ast.Try)) \
                and n.lineno <= line <= (n.end_lineno or n.lineno):
            best = n if best is None or n.lineno >= best.lineno else best
    return best


def _reads(node, skip: frozenset = frozenset()) -> bool:
    return any(_is_size_read(n, skip) for n in ast.walk(node))


def _parts(st) -> list:
    """The expressions a statement evaluates: its value, and the subscripts of the places it writes
    (`self.cache[:seq_len] = freqs` slices with `seq_len`)."""
    out = [getattr(st, "value", None) or st]
    out += [t.slice for t in assign_targets.written(st) if isinstance(t, ast.Subscript)]
    return out


def _size_value(node, skip: frozenset = frozenset()) -> bool:
    """A local's value is a size read off a tensor (`n = x.size(1)`, `n = max(x.shape[0], 4) * k`), not a tensor a
    call made with one among its arguments (`padded = torch.zeros(w * n, x.shape[1])`, then passed on to the
    statement as an operand): the size is read only on a path through arithmetic, subscripts, conditional
    expressions and plain-name calls (`max`, `int`, a helper, `math.ceil`); a method or module call in between (`torch.zeros`,
    `x.new_empty`) turns it into that call's argument."""
    if _is_size_read(node, skip):
        return True
    if isinstance(node, ast.Call):
        f = node.func
        plain = isinstance(f, ast.Name) or isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) \
            and f.value.id in _ARITH_MODULES
        return plain and any(_size_value(a, skip) for a in (*node.args, *(k.value for k in node.keywords)))
    if isinstance(node, (ast.BinOp, ast.UnaryOp, ast.Subscript, ast.IfExp, ast.Tuple, ast.List, ast.BoolOp,
                         ast.Compare, ast.Starred)):
        return any(_size_value(c, skip) for c in ast.iter_child_nodes(node))
    return False


def _params(func) -> set:
    a = getattr(func, "args", None)
    return {x.arg for x in (a.posonlyargs + a.args + a.kwonlyargs)} if a is not None else set()


def counter_attrs(ctx) -> set:
    """Attributes that act as host counters: plain numbers a step changed, or that changed between the steps
    (prepare() setting a length), as the scan's state snapshots saw them."""
    got = getattr(ctx, "_counter_attrs", None)
    if got is None:
        changes = [c for per_step in (*ctx.trace.changes, *getattr(ctx.trace, "staged", ())) for c in per_step]
        got = {c.attr.rsplit(".", 1)[-1] for c in changes if _number(c.before) or _number(c.after)}
        ctx._counter_attrs = got = got - _META
    return got


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def reads_counter(frames, counters: set) -> bool:
    """The innermost statement, or a local it reads that its function binds earlier, loads a host counter
    attribute outside its size reads (`end = self.length + t`, then `torch.ones(t, end)`). A local bound to a
    tensor a call made (`h = x.reshape(self.b, -1, d)`, then `self.proj(h)`) is an operand: the counter is that
    call's, which the earlier varying call already reports."""
    for filename, line in frames[:1]:
        st = _statement(filename, line)
        if st is None:
            return False
        parts = _parts(st)
        names = {n.id for p in parts for n in ast.walk(p) if isinstance(n, ast.Name)}
        bound = _bound(enclosing_function(filename, line), names, st.lineno)
        values = parts + [v for v in bound if not _tensor_made(v)]  # `h = x.reshape(self.b, ...)`: an operand
        return any(_attrs_read(v) & counters for v in values) or passed_counters.passed_counter(
            [(filename, st.lineno)] + list(frames[1:]), parts, counters)  # `start_pos` handed down the layers
    return False


def reads_size(frames) -> bool:
    """The statement running in the innermost frame ((file, line) pairs, innermost first) reads a tensor's size
    (`x.size(1)`, `x.shape[0]`, `x.numel()`, `len(x)`), itself or through a local its function binds from one
    (`n = x.size(1)`, then `torch.ones(n)`); or the value comes in through a parameter (`N = f(num_nodes)`) and
    the caller's statement passing it reads one (`gcn_norm(ei, w, x.size(0))`)."""
    for filename, line in frames:
        st = _statement(filename, line)
        if st is None:
            return False
        parts, skip = _parts(st), grown_containers.grown(filename)
        if any(_reads(p, skip) for p in parts):
            return True
        func = enclosing_function(filename, line)
        names = {n.id for p in parts for n in ast.walk(p) if isinstance(n, ast.Name)}
        bound = _bound(func, names, st.lineno)
        if any(_size_value(v, skip) for v in bound):
            return True
        names |= {n.id for v in bound if not _tensor_made(v) for n in ast.walk(v) if isinstance(n, ast.Name)}
        if not names & _params(func):
            return False
    return False


def _varying_dims(recs) -> list[tuple[int, int]]:
    """(output, dim) of the output sizes that change between the aligned calls."""
    shapes = [tuple(tuple(m.shape) for m in r.outputs) for r in recs]
    if len({tuple(len(s) for s in sh) for sh in shapes}) > 1:
        return []
    return [(k, d) for k in range(len(shapes[0])) for d in range(len(shapes[0][k]))
            if len({sh[k][d] for sh in shapes}) > 1]


def _before(r) -> int:
    """Records before this index ran before the call: its own traced dispatch body (`body:<start>`) is the call."""
    return int(r.note[5:]) if r.note.startswith("body:") else r.index


def follows_varying_shape(ctx, recs, aligned: dict) -> bool:
    """The aligned calls `recs` (one per step) size their output from an earlier call's varying shape."""
    r0 = recs[0]
    if len({r.args for r in recs}) < 2:  # the size reaches the call as a Python value, or it is no read size
        return False
    frames = [(code.co_filename, line) for code, line in reversed(r0.stack)] if r0.stack else []
    if not frames or reads_counter(frames, counter_attrs(ctx)):
        return False
    read = reads_size(frames)
    dims = _varying_dims(recs)
    if not dims:
        return False
    mine = {r.step: r for r in recs}
    whole = next((g for g in aligned.values() if r0 in g and len(g) > len(recs)), None)  # recs: some of its steps
    buffered = None
    unmatched = set(dims)  # each varying size on its own: an image's height and width follow two dimensions
    for other in aligned.values():
        if other is recs or len(other) < len(recs):
            continue
        theirs = {u.step: u for u in other if u.step in mine}  # (composites: the steps of `recs` with equal inputs)
        if theirs.keys() != mine.keys() or any(theirs[s].index >= _before(mine[s]) for s in mine):
            continue  # earlier in the step, and not inside this call's own traced body
        # the earlier call in the same steps: all of them, or the few with equal inputs baked's check compares
        # (then the earlier call ran in every step the whole group ran in)
        want = len(recs) if whole is None else len(whole)
        elided = _elided(ctx, r0, other, mine) if read and len(other) > want and _origin(other) else {}
        same = read and (len(other) == want or len(other) > want and (_statement_skipped(ctx, r0, other, mine)
                                                                       or bool(elided)))
        for k, d in _varying_dims([theirs[s] for s in sorted(theirs)]) if same else ():
            everywhere = {u.step: u for u in other}
            unmatched -= {(j, e) for j, e in unmatched
                          if all(mine[s].outputs[j].shape[e] == theirs[s].outputs[k].shape[d] for s in mine)
                          and all(_sized_alike(qs, j, e, everywhere[s].outputs[k].shape[d])
                                  for s, qs in elided.items())}
            if not unmatched:
                return True
        if not read and _composite_of(ctx, mine, theirs, dims):
            if buffered is None:  # once per call: it walks the step's records back
                buffered = all(_in_call_buffer(ctx, r) for r in mine.values())
            if buffered:
                return True
        if not read and len(other) == len(recs) and restored_dims.restores_input_dims(ctx, mine, theirs, dims):
            return True  # F.linear on a 3-D input views its flat product back to the input's leading sizes
    return bool(read and unmatched and _from_arms(ctx, recs, mine, unmatched))


def _statement_skipped(ctx, r0, other, mine: dict) -> bool:
    """The earlier call ran in steps where this call's statement did not run at all (a helper that returns its
    table untouched when the image's grid is the table's own, timm's `resample_abs_pos_embed`: the interpolation
    runs in the other steps only): matching it in this call's steps alone is fair. A statement that ran there with
    another op (a slice torch elides to an alias when its bound covers the whole dimension) is not skipped."""
    missing = {u.step for u in other} - set(mine)
    return bool(missing) and not any(q.stack == r0.stack for s in missing for q in ctx.ops(s))


def _elided(ctx, r0, other, mine: dict) -> dict:
    """{step: the statement's records there} for the steps where the earlier call ran and this one did not, when the
    statement ran in each of them with another op (`hist[: counts.numel()]` is an alias, no `slice`, when the
    bincount's length fills the buffer); {} when some such step did not run the statement."""
    out = {}
    for s in {u.step for u in other} - set(mine):
        qs = [q for q in ctx.ops(s) if q.stack == r0.stack and q.op != r0.op]
        if not qs:
            return {}
        out[s] = qs
    return out


def _origin(calls) -> bool:
    """The calls' inputs kept their shapes while their outputs' varied: the varying size starts there (a `bincount`,
    reported as dynamic-shape itself). A `torch.stack(heads)` of a list whose length varies is no origin, and a
    slice cut to its length stays a finding of its own."""
    return len({tuple(tuple(m.shape) for m in u.inputs) for u in calls}) == 1


def _sized_alike(qs, j: int, e: int, size: int) -> bool:
    """One of the statement's records in an elided step has output `j`'s dimension `e` of `size`: the alias spans
    what the slice would have cut, so that step follows the same size too."""
    return any(len(q.outputs) > j and len(q.outputs[j].shape) > e and q.outputs[j].shape[e] == size for q in qs)


def _from_arms(ctx, recs, mine: dict, dims) -> bool:
    """Steps that parted upstream read the size off a tensor one arm made in some steps and the other arm in the
    rest (timm's NaFlex position table: `pos_embed.reshape(1, h * w, -1)` when the grid is the table's own, an
    interpolation otherwise; then `x[:, :min(x.shape[1], pos.shape[1])]`): no one call ran in every step, but in
    each step the size equals the same dimension of an earlier output of a call that ran in only some of the steps
    or whose shape varies, or that made a tensor the statement goes on to take (`_operand_makers`), and at least
    one such call ran in only some (else the aligned calls matched)."""
    sites = {s: ctx.sites(s) for s in mine}
    seen = defaultdict(set)
    shapes = defaultdict(set)
    for s, table in sites.items():
        for key, u in table.items():
            seen[key].add(s)
            shapes[key].add(tuple(tuple(o.shape) for o in u.outputs))
    if all(v == set(mine) for v in seen.values()):
        return False  # the steps never parted
    mine_ids = {id(r) for r in recs}
    operands = {s: _operand_makers(ctx, r) for s, r in mine.items()}
    partial = False
    for j, e in dims:
        for d in range(max((len(o.shape) for r in recs for o in r.outputs), default=0)):
            hit = set()
            for s, table in sites.items():
                want = mine[s].outputs[j].shape[e]
                for key, u in table.items():
                    some = seen[key] != set(mine)
                    if id(u) in mine_ids or u.index >= _before(mine[s]) or \
                            not (some or len(shapes[key]) > 1 or u.index in operands[s]):
                        continue
                    if any(len(o.shape) > d and o.shape[d] == want for o in u.outputs):
                        hit.add(s)
                        partial |= some
            if hit == set(mine):
                break
        else:
            return False
    return partial


def _operand_makers(ctx, r) -> set:
    """Indices of the ops that made the tensors the rest of `r`'s statement takes (the same frames, after `r`):
    `self.out[:, :valid.shape[1]] = valid` reads the size of the `valid` its copy takes. An arm that returns a
    tensor of one fixed shape in the steps it ran (transformers' `_speculative_sampling` returning the resampled
    token alone when nothing was accepted, a `cat` of the accepted prefix and that token otherwise) made it there."""
    recs = ctx.steps[r.step] if r.step < len(ctx.steps) else []
    if r.index >= len(recs) or recs[r.index] is not r:
        return set()
    tids = set()
    for q in recs[r.index + 1:]:
        if q.kind != "aten":
            continue
        if q.stack != r.stack:
            break
        tids |= {m.tid for m in q.inputs}
    made = {}
    for q in recs[:r.index]:  # the last op before `r` that output each address (addresses are reused)
        for o in q.outputs:
            if o.tid in tids:
                made[o.tid] = q.index
    return set(made.values())


def _composite_of(ctx, mine: dict, theirs: dict, dims: list) -> bool:
    """The call, a factory or a view of its buffer (_in_call_buffer), is inside one torch call of the statement that
    takes the earlier call's outputs (`pad_sequence(list(torch.split(v, lens)))` makes `full([B, max_len])`, then
    copies each piece into its narrowed rows; a slice of another tensor by the same host length is neither, and
    stays a source): in every
    step each varying size equals one dimension (the same one each step) of one of those outputs (a different
    piece's in another step: the longest), and an op the same call runs after it reads one of them. The size is
    read inside torch, below any statement."""
    for d in {d for _, d in _varying_dims(list(theirs.values()))}:
        if all(any(len(o.shape) > d and mine[s].outputs[j].shape[e] == o.shape[d] for o in theirs[s].outputs)
               for s in mine for j, e in dims) \
                and all(_reads_later(ctx, r, {o.tid for o in theirs[s].outputs}) for s, r in mine.items()):
            return True
    return False


def _in_call_buffer(ctx, r, depth: int = 4) -> bool:
    """A factory (no tensor input), or a view of the buffer one made earlier in the same call, through views made
    there too (`pad_sequence` copies each piece into `out.select(0, i).narrow(0, 0, len)`): not a slice of a tensor
    the statement had before it."""
    if not r.inputs:
        return True
    recs = ctx.steps[r.step] if r.step < len(ctx.steps) else []
    tid = r.inputs[0].tid
    made = next((q for q in reversed(recs[:r.index]) if q.kind == "aten" and any(o.tid == tid for o in q.outputs)),
                None)
    return made is not None and made.stack == r.stack and depth > 0 and _in_call_buffer(ctx, made, depth - 1)


def _reads_later(ctx, r, tids: set) -> bool:
    """An op of the same call (the same frames) that runs after `r` in its step reads one of `tids`."""
    recs = ctx.steps[r.step] if r.step < len(ctx.steps) else []
    if r.index >= len(recs) or recs[r.index] is not r:
        return False
    for q in recs[r.index + 1:]:
        if q.kind != "aten":
            continue
        if q.stack != r.stack:
            return False
        if any(m.tid in tids for m in q.inputs):
            return True
    return False
