"""cpu-side-effect: the step changed Python state (a counter, a list, an attribute, a global).

Replay runs kernels only: a Python side effect happens once, at capture, and never again, so
anything that reads it later (a position counter, a history list) silently goes stale. The tracer
snapshots plain attributes of every object reachable from the target (and user-module globals)
around each audited step. The source line comes from the nn.Module.__setattr__ hook when the
change went through it, otherwise from the owner's source (the statements that mutate it), and for
an object of a stdlib or installed class (a queue.Queue) from the user's call into that object.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import inspect
import re
from collections import defaultdict

from audit.detectors import register
from audit.detectors.state import (between_steps, co_holders, constructors, drawn as _drawn, elements,
                                   foreign_threads, handoff, held_objects, library_callers, module_refs, ran_hooks,
                                   reached_twice, rebinds)
from audit.detectors.device import capture_guards
from audit.detectors.source import descriptors, implicit, mutations
from audit.detectors.tensors import fresh_slots
from audit.detectors.state.sites import (called_by_name, caller_of, closure_functions, code_span, generated_sites,
                                          generator_sites, hook_caller, hooked_call, object_at, state_fps,
                                          tensor_slot_line, unchanged_slot_line, whole_state_fp)
from audit.detectors.host.kept import from_device, host_data, host_tensors, in_place_updates, kept_on_host
from audit.detectors.host.staging_writes import on_kept_host, staging_buffers
from audit.detectors.allocation import escape_lines, escaped_members, shifted_members
from audit.scan.patches import mp_queues
from audit.scan.snapshot import class_state, global_rng, script_state, staging_bytes, state
from audit.scan.snapshot.own_dict import own_dict
from audit.scan.sources import loaded
from audit.detectors.source import methods as _methods
from audit.detectors.state import first_use, queue_puts
from audit.scan.sources.user_code import HIDDEN, LIBRARY, OWN, frame_kind, is_user_file


def _source_sites(ctx, change, step: int) -> tuple[list, str]:
    """Candidate (file, line, function) for a change that did not go through __setattr__, and a note
    for the message. Statements in functions that ran come first; for an object of a stdlib or
    installed class whose mutating code did not show up (the stdlib's frames are hidden), the
    user's call into it (`self.out.put_nowait(t)`); statements of the stdlib and torch never."""
    if gen := generator_sites(ctx, change):
        return gen, ""
    if change.owner.startswith("<globals "):  # a function exec'd into a plain namespace
        own = {f for f, _ in library_callers.executed(ctx, step, own_only=True)}
        return generated_sites(ctx, change, own, library_callers.executed(ctx, step)), ""
    files, foreign = _owner_files(ctx, change, step)
    ran = library_callers.executed(ctx, step)
    if not change.owner.startswith(("<module ", "<closure ")):  # `self.meta.tokens += 1` lives in the caller's code
        files += [(f, None, False) for f in sorted({f for f, _ in library_callers.executed(ctx, step, own_only=True)})]
    if drawn := _drawn.sites(ctx, change, step, files):  # a host generator: the call on it that ran drew
        return drawn, ""
    if mp_queues.is_queue_fp(change.after):  # a multiprocessing queue, compared by its puts
        return queue_puts.sites(ctx, change, step, files), ""
    cands = []
    attr = change.attr
    if "." in attr:  # `METRICS.steps += 1` on a global object, `self.cache.filled += 1` on a tensor
        attr = attr.split(".")[-1]
        if change.owner.startswith("<module "):
            files = [(f, s, False) for f, s, _ in files]
    for file, span, glob in files:
        if not file:
            continue
        cands += [((file, fn) in ran, file, line, fn) for line, fn in
                  mutations.mutation_sites(file, attr, span, global_name=glob) if not constructors.skipped(change, fn)]
    cands += [((f, fn) in ran, f, line, fn) for f, line, fn in held_objects.holder_sites(ctx, change)]  # `self.info.n`
    if not cands and whole_state_fp(change.after):  # `self.rng.random()`, an iterator: a call on it changed it
        cands = [(f, line, fn) for f, span, glob in files if f
                 for line, fn, _ in mutations.method_calls(f, attr, global_name=glob)
                 if fn not in ("__init__", "prepare") and (not span or span[0] <= line <= span[1])]
        cands = [((f, fn) in ran, f, line, fn) for f, line, fn in dict.fromkeys(cands)]
    if change.owner.startswith("<closure "):  # the closure whose cell changed, not the scope that made it
        own = change.owner[9:-1].split(".")[-1]
        cands = [c for c in cands if c[3] == own] or cands
    best = [(f, line, fn) for r, f, line, fn in cands if r]
    if not best and not change.owner.startswith(("<module ", "<closure ")):  # nothing nearer ran: a library
        for spans in (_library_spans, between_steps.reached_spans):  # a helper handed the object, then its callees
            best = best or [(f, n, fn) for f, span, _ in spans(ctx, step)
                            for n, fn in mutations.mutation_sites(f, attr, span, named=bool(cands))
                            if not constructors.skipped(change, fn)]  # the owner's own statements beat a computed setattr
    if best:
        return between_steps.fitting(best, change)[:3], ""
    emptying = {fn for _, f, line, fn in cands if between_steps.empties(f, line, fn, change)}  # `_reset()`: `.clear()`
    calls, note, methods = _calls_into(ctx, change, foreign, ran, emptying, step) if cands or foreign else ([], "", set())
    # a method the step called on the object that ran no torch op (`self.lru.touch(ids)`): its own
    # statement (`self.order.move_to_end(b)`) is the site, not the class's other mutating methods
    inside = implicit.accessor_sites(ctx, [(f, line, fn) for _, f, line, fn in cands if fn in methods
                                            and fn not in emptying and frame_kind(f, ctx.trace.roots) != HIDDEN])
    if inside:
        return inside[:3], note if foreign else ""
    if foreign and calls:  # the object's own methods write nothing there: a co-holder's call (`sched.step()`)
        return co_holders.instead(ctx, change, calls, note, methods, ran)
    shown = implicit.accessor_sites(ctx, between_steps.step_sites(
        ctx, step, [(f, n, fn) for _, f, n, fn in cands if frame_kind(f, ctx.trace.roots) != HIDDEN], change))
    if not shown and foreign:  # no statement of its own: a co-holder's call whose method writes elsewhere
        calls, note, methods = _calls_into(ctx, change, foreign, ran, emptying, step, strict=False)  # (`sched.step()`)
        if calls:
            return co_holders.instead(ctx, change, calls, note, methods, ran)
    return shown[:3], ""


def _library_spans(ctx, step: int) -> list:
    """(file, span, global-name) of each installed library function that ran torch ops in the step. A module-level
    helper that mutates an object passed to it (`def advance(state): state.num_computed += 1`) lives in neither
    the target's files nor the object's class; only the functions that ran are searched (then those they call)."""
    spans = {}
    for r in ctx.steps[step]:
        for code, _ in r.stack:
            if ctx.trace.is_own(code) or frame_kind(code.co_filename, ctx.trace.roots) != LIBRARY:
                continue
            spans[(code.co_filename, code.co_firstlineno)] = (code.co_filename, code_span(code), False)
    return [spans[k] for k in sorted(spans)] + ran_hooks.hook_spans(ctx, step)  # hooks run no op of their own


def _owner_files(ctx, change, step: int) -> tuple[list, str]:
    """(file, span, global-name) to search for the change's statements, and the owner's class name
    (`queue.Queue`) when none of its classes is in the user's files (else "")."""
    if change.owner.startswith("<module "):
        mod = loaded.module_named(change.owner[8:-1])
        obj = _global_object(mod, change.attr) if mod is not None and "." in change.attr else None
        refs = module_refs.referring_files(mod, library_callers.head(change.attr), library_callers.executed(ctx, step))  # `ps.STATS[k] += 1`
        inner = _class_files(type(held).__mro__[:-1]) if (held := _held_by_global(obj, change.attr)) is not None else []
        return [(getattr(mod, "__file__", None), None, True), *refs, *inner], _foreign_class(ctx, obj)
    if change.owner.startswith("<closure "):  # `nonlocal count; count += 1`: a bare name in the code that ran,
        files = [(f, None, True) for f in sorted({f for f, _ in library_callers.executed(ctx, step, own_only=True)})]
        for fn in closure_functions(ctx, change.owner):  # or in the closure's own function (a library hook's)
            files.append((fn.__code__.co_filename, code_span(fn.__code__), True))
        return list(dict.fromkeys(files)), ""
    if change.owner.startswith("<class "):  # `cls.instances += 1`: in the class, its bases or its metaclass
        cls = class_state.CLASSES.get(change.owner)
        held = elements.class_held(ctx, change.owner, change.attr)  # an object kept on it (`crit.n`)
        return _class_files((cls.__mro__[:-1] + type(cls).__mro__[:-2] if cls is not None else ()) +
                            (type(held).__mro__[:-1] if held is not None else ())), ""
    obj = object_at(ctx, change.owner)
    if isinstance(obj, functools.partial):  # its function mutates an argument the partial froze: a bare name
        fn = inspect.unwrap(obj.func)
        try:
            lines, start = inspect.getsourcelines(fn)
            return [(inspect.getsourcefile(fn), (start, start + len(lines)), True)], ""
        except (OSError, TypeError):
            return [], ""
    return _class_files(script_state.source_class(obj).__mro__ if obj is not None else ()), _foreign_class(ctx, obj)


def _class_files(classes) -> list:
    """(file, span, False) of each class that has source."""
    files = []
    for cls in classes:
        try:
            lines, start = inspect.getsourcelines(cls)
            files.append((inspect.getsourcefile(cls), (start, start + len(lines)), False))
        except (OSError, TypeError):
            continue
    return files


def _global_object(mod, attr: str):
    """The object whose attribute changed under a module global: the global itself (`METRICS.steps`)
    or the member of a global list or dict (`_REGISTRY['decode'].count`), else None."""
    obj = vars(mod).get(library_callers.head(attr))
    key = re.match(r"[^.\[]*\[(.*)\]\.[^.]*$", attr)
    if key is not None and isinstance(obj, (dict, list, tuple)):
        with contextlib.suppress(Exception):
            k = ast.literal_eval(key.group(1))
            return obj[k]
        return None
    return obj


def _held_by_global(obj, attr: str):
    """The object a global holds whose attribute changed (`MAXL._sum` of `MAXL._sum._value`: a metric's value
    object), where the change is below the global's own attributes; else None."""
    parts = attr.split(".")
    if obj is None or len(parts) < 3 or "[" in attr:
        return None
    for name in parts[1:-1]:  # attributes, and the positions of the lists they hold (`_buckets.1`)
        obj = obj[int(name)] if name.isdigit() and isinstance(obj, (list, tuple)) and int(name) < len(obj) \
            else own_dict(obj).get(name)
    return obj


def _foreign_class(ctx, obj) -> str:
    """`module.Class` of an object none of whose classes is defined in the user's files, else ""."""
    if obj is None:
        return ""
    for cls in script_state.source_class(obj).__mro__[:-1]:  # a scripted module: the class it was scripted from
        try:
            if is_user_file(inspect.getsourcefile(cls) or "", ctx.trace.roots):
                return ""
        except TypeError:  # a builtin class: no source
            continue
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def _calls_into(ctx, change, cls: str, ran: set, emptying: set, step: int, strict: bool = True) -> tuple[list, str, set]:
    """The user's lines that call a method of the changed object (`self.out.put_nowait(t)`): found in
    the files of the step's own code and of the object that holds it, from the attribute holding it.
    Calls in functions that ran come first, then those in functions the step reaches by name (`Gauge.set`, not
    `Counter.reset`); `strict`: without the methods that never write the attribute. Also the names of the methods
    called."""
    module = change.owner.startswith("<module ")
    holder, files = (library_callers.head(change.attr), [getattr(loaded.module_named(change.owner[8:-1]), "__file__", None)]) \
        if module else library_callers.holder(ctx, change.owner)
    if not holder:
        return [], "", set()
    files = sorted({f for f in files if f} | {f for f, _ in ran if is_user_file(f, ctx.trace.roots)})
    hits = [((f, fn) in ran, f, line, fn, m) for f in files
            for line, fn, m in mutations.method_calls(f, holder, global_name=module) if fn not in ("__init__", "prepare")]
    if not module and (fields := _other_fields(ctx, change)):  # `task.start_time = t` leaves `completed` alone
        hits = [h for h in hits if h[4] not in fields]
    if not module and strict:  # `task._reset()`, whose source never writes `completed` (or only empties `_progress`)
        attr = library_callers.head(change.attr)
        hits = [h for h in hits if h[4] not in emptying and
                not _methods.writes_nothing(object_at(ctx, change.owner), h[4], attr)]
    reached = between_steps.step_names(ctx, step, {h[1] for h in hits}) if len(hits) > 1 else set()
    hits = [h for h in hits if h[0] or h[3] in reached] or hits  # `Gauge.set` the step called, not `Counter.reset`
    best = [h for h in hits if h[0]] or hits
    methods = ", ".join(dict.fromkeys(f"`.{m}()`" for *_, m in best[:3]))
    return ([(f, line, fn) for _, f, line, fn, _ in best[:3]], f"inside a `{cls}`, through {methods}",
            {m for *_, m in best})


def _other_fields(ctx, change) -> set:
    """The changed object's own attributes other than the one that changed: a store to one of them through the
    holding name (`task = self._tasks[i]; task.start_time = t`) changes that attribute only."""
    obj = object_at(ctx, change.owner)
    names = {k for k, _ in state._instance_items(obj)} if obj is not None else set()
    if obj is not None and dataclasses.is_dataclass(obj):  # a field with a class default (`stop_time = None`)
        names |= {f.name for f in dataclasses.fields(obj)}
    return names - {change.attr.split(".")[0]}


@register("cpu-side-effect")
def python_state_changes(ctx):
    """Plain attributes / globals that differ before and after a step: replay will not redo it."""
    changed = defaultdict(list)  # (owner, attr) -> [(step, change)]
    for s, changes in enumerate(ctx.trace.changes):
        for c in changes:
            if c.owner not in (global_rng.OWNER, staging_bytes.OWNER):  # their own rules: global_rng, staging_refill
                changed[(c.owner, c.attr)].append((s, c))
    setattrs = defaultdict(list)  # "owner\0attr" -> records
    for r in ctx.all_records(("setattr",)):
        setattrs[r.note].append(r)
    out, unsited, sited, filled, located = [], [], set(), set(), []
    escaped = escape_lines(ctx)
    own_files = {ent[0].co_filename for ent in ctx.trace.codes.values() if ent[1] == 2}
    for (owner, attr), hits in changed.items():
        s, c = hits[0]
        count = len(hits) / ctx.n_steps
        msg = _message(c)
        recs = [r for r in setattrs.get(f"{owner}\x00{attr}", ()) if r.stack]
        if recs and (escaped_members(ctx, c) or fresh_slots.rewritten_each_step(ctx, hits)):  # a module's
            continue  # `self.cache = (k, v)` a later step reads (step-allocation's escape), or a list of the step's
            # own clones no later step reads (LitEma's `collected_params`): as for a plain object's slot
        if recs:  # the step's last assignment left the value it ended with (`reset()` zeroing it came before)
            rec = ([r for r in recs if r.step == s] or recs)[-1]
            text, sev = _guarded(msg, rec.stack[-1][0].co_filename, rec.stack[-1][1])
            out.append(ctx.finding("cpu-side-effect", rec, "setattr", count, text, severity=sev))
            continue
        if escaped_members(ctx, c) or fresh_slots.rewritten_each_step(ctx, hits):  # the tensor detectors' own
            continue
        sites, note = _source_sites(ctx, c, s)
        if foreign_threads.other_threads_only(sites, library_callers.executed(ctx, s)) or \
                foreign_threads.thread_work_only(ctx, s, sites, library_callers.executed(ctx, s)) or \
                foreign_threads.unnamed_holder(ctx, s, c, sites):  # a thread's own
            continue
        if c.tensor_members_only and not shifted_members(c):  # a container slot rebound to a tensor made on
            # that same line: step-allocation reports it. A window whose older members moved (a full deque
            # appended to, `frames.append(obs.clone())`) is state of its own, even on the allocating line.
            sites = [x for x in sites if (ctx.rel(x[0]), x[1]) not in escaped]
            if not sites:
                continue
        sites = [x for x in sites if not tensor_slot_line(ctx, c, x, escaped)]
        sites = [x for x in sites if not unchanged_slot_line(c, x) and not between_steps.lazy_init_line(c, x)] or sites
        sites = descriptors.ran_accessors(ctx, owner, sites, s)
        handed = handoff.handed_over(ctx, c, library_callers.executed(ctx, s, own_only=True)) \
            if rebinds.handed_back_only(sites, c.attr) and not owner.startswith("<") else []
        sites = [] if handed else sites  # `self.kw = lib.update(self.kw)`: the library changed it, the store puts it back
        for file, line, fn, call in handed:  # handed to a library that changes it under its own name
            text, sev = _guarded(_message(c), file, line)
            out.append(ctx.finding("cpu-side-effect", (file, line, fn), "mutate", count, text, severity=sev,
                                   module=owner, caller=call))
        if not sites and not handed:
            unsited.append((c, count, msg, owner))
        else:
            sited.add(state_fps(c))
        for site in sites:
            text, sev = _guarded(_message(c, site, note), site[0], site[1])
            caller = caller_of(ctx, site, s)
            own_site = site[0] in own_files or frame_kind(site[0], ctx.trace.roots) == OWN  # its own caller
            if caller is None and not own_site:  # library code the step's ops never ran in
                caller = (descriptors.accessor_call(ctx, owner, site, s)
                          or hooked_call(ctx, site, s) or hook_caller(ctx, c.owner, s)
                          or constructors.constructor_call(ctx, site, s) or implicit.class_call(
                    class_state.CLASSES.get(c.owner), site, own_files, library_callers.executed(ctx, s, own_only=True))
                          or library_callers.user_call_into(ctx, c, s, own_files, implicit.syntax_of(site))
                          or elements.container_call(ctx, c.owner, own_files, library_callers.executed(ctx, s, True), site[2], c.attr)
                          or library_callers.user_call_of(ctx, site, s, own_files)
                          or implicit.inline_uses(own_files, site, library_callers.executed(ctx, s, own_only=True))
                          or called_by_name(ctx, site, s, elements.held_names(ctx, c.owner))
                          or elements.handed_call(ctx, c.owner, own_files, library_callers.executed(ctx, s, True)))
            near = caller or (site if own_site else None)  # the target's line that led there
            if first_use.first_fill(ctx, owner, attr, hits, near, changed):  # a lazy first fill
                text, sev = text + first_use.NOTE, "info"
                filled.add((owner, attr))
            found = ctx.finding("cpu-side-effect", site, "mutate", count, text, severity=sev, module=owner,
                                caller=caller)
            located.append((reached_twice.shared_key(c), owner, site, s, found))
    out += reached_twice.keep_ran(ctx, located)
    for c, count, msg, owner in unsited:  # one object reached two ways (an attribute and a closure cell): once
        if state_fps(c) not in sited:
            fill = first_use.under_fill(owner, c.attr, c.before, filled)
            out.append(ctx.finding("cpu-side-effect", ("<python state>", 0, ""), "mutate", count,
                                   msg + " (no source line found)" + (first_use.NOTE if fill else ""), module=owner,
                                   severity="info" if fill else None))
    return out


def _message(change, site=None, note: str = "") -> str:
    """What the step changed, naming the element the site's line writes when it indexes a container
    with a constant (`self.stats["active"].append(n)`: the `active` list, not another key)."""
    key = None
    if site is not None and site[0] and not site[0].startswith("<"):
        glob = change.owner.startswith(("<module ", "<closure "))
        attr = change.attr.split(".")[-1]
        key = mutations.subscript_key(site[0], site[1], attr, global_name=glob and "." not in change.attr)
    what = change.describe(key)
    return f"the step changes {what}{f' ({note})' if note else ''}; a replay would not"


def _guarded(msg: str, file: str, line: int) -> tuple[str, str | None]:
    """(message, severity): info when the statement sits on the side of an `if` a capture never runs
    (`if not torch.cuda.is_current_stream_capturing():`): bookkeeping of eager steps only."""
    guard = capture_guards.capture_guard(file, line) if file and line else None
    if guard:
        return f"{msg}; skipped while a graph is captured (`{guard}`): it counts eager steps only", "info"
    return msg, None


@register("cpu-side-effect")
def host_tensors_changed_in_place(ctx):
    """A host tensor the target keeps (a step counter kept as `torch.zeros((), device="cpu")`, a pageable token
    bitmask a host matcher refills) updated in place by the step, before any send of it to the device: on a GPU
    that op runs on the CPU, outside the graph, once at capture and never on replay."""
    host = staging_buffers(ctx)
    if not host:
        return []
    hits = [r for r in in_place_updates(ctx, host) if (r.inputs[0].sid in host_tensors(ctx) or _host_values_in(ctx, r))
            and not from_device(ctx, r, host)]  # those are host-sync's
    return [ctx.finding("cpu-side-effect", g[0], op, len(g) / ctx.n_steps,
                        f"the step updates the host tensor `{host[g[0].inputs[0].sid]}` in place (`{op}`): on a GPU "
                        "this runs on the CPU, outside the graph, so a replay would not redo it",
                        fix="Keep the counter on the device and update it inside the step (`self.steps.add_(1)` on a "
                            "device tensor), or do the host bookkeeping in prepare().")
            for (_, _, op, _), g in ctx.per_site(hits).items()]


def _host_values_in(ctx, r) -> bool:
    """A write of the step's own host values (Python scalars, lists) into a large host buffer the target keeps,
    before the step sends it (a matcher refilling a token bitmask); not a copy between kept buffers, which
    writes the same rows every step (a swap space refilled from host rows)."""
    return on_kept_host(ctx, r) and all(m.sid in host_data(ctx, r.step) for m in r.inputs[1:])


@register("cpu-side-effect")
def saved_by_the_step(ctx):
    """`torch.save` of a tensor in host memory (a host counter, a host-made table): it waits for nothing, so
    it is no host sync, but writing the file is host work a replay never redoes. (Saving a device tensor is
    a host-sync finding: the copy to the host blocks capture.)"""
    hits = [r for r in ctx.all_records(("host",)) if r.op == "torch.save" and kept_on_host(ctx, r)]
    return [ctx.finding("cpu-side-effect", g[0], op, len(g) / ctx.n_steps,
                        "`torch.save` in the step writes on the host: it runs once when the graph is captured, "
                        "and a replay writes nothing",
                        fix="Save after replay (outside the captured step), e.g. in prepare() or after the decode loop.")
            for (_, _, op, _), g in ctx.per_site(hits).items()]
