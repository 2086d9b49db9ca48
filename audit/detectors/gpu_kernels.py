"""host-sync and pageable-copy the run could not see: inside the kernel a GPU runs for a custom op.

A custom op may carry one kernel per device: a device-generic body with a `register_kernel("cpu")` reference
beside it, `custom_op(..., device_types="cpu")` with a `register_kernel("cuda")`, or `Library.impl` under "CPU"
and "CUDA". A CPU scan runs the CPU kernel (what it traces there is info: device/cpu_only.py) and never the
other one, yet that is the kernel the captured step runs on a GPU: a `k.item()` sizing its `topk`, a
`.cpu().tolist()` of the routing, a `torch.tensor(meta, device=x.device)` there waits or copies inside the step.
For each CPU kernel the step ran (audit/scan/standins/cpu_kernels.py), the GPU kernel's source is read as
guarded_sync reads an untaken device branch (its CUDA sides, and the helpers it calls): synchronizing calls are
host-syncs (not a read of an argument that is host memory on a GPU as well: a tensor the target keeps on the
host, `seq_lens_cpu`), host data sent to the device pageable-copies, at their lines, with the step's call of the op
as caller. CUDA scans skip this rule: there the GPU kernel ran and was traced.
"""

from __future__ import annotations

import ast

from audit.detectors import register
from audit.detectors.device import callee_waits
from audit.detectors.guarded_sync import _sync_call
from audit.detectors.guarded_uploads import upload
from audit.detectors.host import host_args, kept
from audit.detectors.source import lookup
from audit.scan.sources.user_code import HIDDEN, frame_kind
from audit.scan.standins.cpu_kernels import GPU_KERNELS


def _ran(ctx) -> dict:
    """(GPU kernel's file, first line, op name) -> (caller (file, line, function), positions of the op's arguments
    that live in host memory on a GPU too): the other kernels of the custom ops whose CPU kernel ran in the audited
    steps, with the frame that called the op."""
    out = {}
    for s in ctx.complete:
        recs = ctx.steps[s]
        for r in recs:
            if not r.note.startswith("body:"):
                continue
            gpu = next((g for rr in recs[int(r.note[5:]):r.index] for code, _ in rr.stack
                        if (g := GPU_KERNELS.get((code.co_filename, code.co_firstlineno)))), None)
            if gpu is None or gpu in out:
                continue
            outer = [(c, ln) for c, ln in r.stack if frame_kind(c.co_filename, ctx.trace.roots) != HIDDEN]
            caller = (outer[-1][0].co_filename, outer[-1][1], outer[-1][0].co_name) if outer else None
            out[gpu] = (caller, _host_positions(ctx, r))
    return out


def _host_positions(ctx, r) -> set:
    """Positions of the op's arguments that are host memory on a GPU as well (a tensor the target keeps on the
    host, host data built in the step: vLLM-style `seq_lens_cpu`), read off the record's tensor inputs."""
    host = kept.read_kept(ctx, r.step) | kept.host_data(ctx, r.step)
    inputs, out = iter(r.inputs), set()
    for pos, a in enumerate(r.args):
        if isinstance(a, str) and a == "<T>" and (m := next(inputs, None)) is not None and m.sid in host:
            out.add(pos)
    return out


def _root(call: ast.Call):
    """The name a synchronizing call reads: `lens` of `lens.cpu().tolist()` or of `int(lens.max())`."""
    node = call.args[0] if isinstance(call.func, ast.Name) and call.args else call.func
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _kernel_hits(ctx, pick):
    """(file, line, function, what, op name, caller) for each call `pick` names in the GPU kernels' source."""
    for (file, first, op), (caller, host_pos) in _ran(ctx).items():
        func = lookup.enclosing_function(file, first + 1)
        if func is None or func is lookup.tree(file):
            continue
        params = [a.arg for a in func.args.posonlyargs + func.args.args]
        host = {params[p] for p in host_pos if p < len(params)} - _assigned(func)
        body = list(callee_waits.gpu_statements(func, file))
        own = [(file, c.lineno, func.name, what) for st in body for c in ast.walk(st)
               if (what := pick(file, c)) and _root(c) not in host]
        below = callee_waits.waits_below(file, body, lambda c: pick(None, c), ctx.trace.roots)
        for hit in [*own, *below]:
            yield (*hit, op, caller)


def _assigned(func) -> set:
    """Names the kernel assigns (a parameter rebound there no longer holds what the op was handed)."""
    return {t.id for n in ast.walk(func) if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign))
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}


def _sync(file, call):
    what = _sync_call(call)
    return what if what and (file is None or not host_args.reads_host(file, call)) else None


def _findings(ctx, category: str, pick, does: str, fix: str):
    if ctx.cuda:
        return []
    out, seen = [], set()
    for file, line, fname, what, op, caller in _kernel_hits(ctx, pick):
        if (file, line) in seen:
            continue
        seen.add((file, line))
        out.append(ctx.finding(
            category, (file, line, fname), what, 0.0,
            f"`{what}()` in `{fname}()`, the kernel a GPU runs for `{op}` (this CPU scan ran the op's CPU kernel "
            f"instead): on the GPU it {does} inside the step (found in the source, not traced)",
            fix=fix, caller=caller))
    return out


@register("host-sync")
def syncs_in_gpu_kernels(ctx):
    """On a CPU scan: synchronizing calls in the GPU kernel of a custom op whose CPU kernel the step ran."""
    return _findings(ctx, "host-sync", _sync, "waits for the device",
                     "Keep the kernel on the device: pass sizes from the host outside the step, or use a "
                     "fixed-size form (a mask instead of a count).")


@register("pageable-copy")
def uploads_in_gpu_kernels(ctx):
    """On a CPU scan: host data sent to the device in the GPU kernel of a custom op whose CPU kernel ran."""
    return _findings(ctx, "pageable-copy", lambda _f, c: upload(c), "copies host data from pageable memory",
                     "Build the data on the device, or keep a persistent device buffer refilled outside the step.")
