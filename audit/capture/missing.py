"""Which kernel is missing from a graph, and which line launched it (uncaptured-kernel leaves).

A graph that holds fewer kernel nodes than an eager run launched names no kernel. The ones it
lacks are those issued on streams that were not part of the capture, so we profile one more eager
run with Python stacks (torch.profiler, with_stack=True), find the capture stream from a marker
kernel launched on it first, and take the side streams whose kernel counts make up the missing
number. The first of their kernels, by start time, is the first kernel missing from the graph, and
the CPU op that launched it is found through its linked correlation id.

The line comes from our own record, not the profiler's: current torch attaches Python stacks to
its function events only (at the function's first line), never to the aten op, so a dispatch mode
notes the user frame of every op dispatched while a stream other than the entry stream is current.
The first such op with the launching op's name is the line to fix. Kernels launched outside any
torch op (an external library on a cached stream) pass no dispatch: the answer names the kernel only.
"""

from __future__ import annotations

import re

from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["SideStreamSites", "first_missing_kernel", "pick_streams", "stack_site"]

_FRAME = re.compile(r"^(?P<file>.*)\((?P<line>\d+)\): (?P<func>.*)$")


def stack_site(stack) -> dict | None:
    """The innermost user frame of a profiler stack ("file(line): function" entries, innermost first)."""
    from audit.scan.sources.user_code import is_user_file

    for entry in stack or ():
        m = _FRAME.match(str(entry))
        if m and is_user_file(m["file"]):
            return {"file": m["file"], "line": int(m["line"]), "function": m["func"]}
    return None


def _user_site() -> dict | None:
    """The innermost frame of the running Python stack in code a person would edit."""
    import sys

    from audit.scan.sources.user_code import is_user_file

    f = sys._getframe(1)
    while f is not None:
        if is_user_file(f.f_code.co_filename):
            return {"file": f.f_code.co_filename, "line": f.f_lineno, "function": f.f_code.co_name}
        f = f.f_back
    return None


class SideStreamSites(TorchDispatchMode):
    """Notes (aten name, user site) of each op dispatched while the current stream is not the one
    current on entry; an op on the entry stream costs one stream lookup."""

    def __init__(self, stream_key):
        super().__init__()
        self.key, self.main, self.sites = stream_key, stream_key(), []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.key() != self.main:
            site = _user_site()
            if site:
                self.sites.append((func._schema.name, site))
        return func(*args, **(kwargs or {}))


def pick_streams(counts: dict, missing: int) -> list:
    """Side streams (in order of first kernel) whose kernels add up to the missing number: a single
    stream with exactly that many first, else the earliest streams until the number is reached."""
    exact = [s for s, n in counts.items() if n == missing]
    if exact:
        return exact[:1]
    out, total = [], 0
    for s, n in counts.items():
        if total >= missing:
            break
        out.append(s)
        total += n
    return out


def first_missing_kernel(fn, sync, missing: int) -> dict | None:
    """{kernel, stream_kernels, file, line, function, op} of the first kernel a graph lacks, or None."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    if missing <= 0:
        return None
    sync()
    recorder = SideStreamSites(lambda: torch.cuda.current_stream().cuda_stream)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True) as prof:
        torch.cuda._sleep(1)  # the marker: its stream is the capture stream
        with recorder:
            fn()
        sync()
    return locate(list(prof.events()), missing, recorder.sites)


def locate(events: list, missing: int, sites: list = ()) -> dict | None:
    """The first missing kernel among profiler events, and the user line of the op that launched it
    (sites: (aten name, user site) of the ops dispatched on side streams, in order)."""
    from torch.autograd import DeviceType

    from audit.capture.graph import _is_memop

    def is_cpu(e) -> bool:
        return getattr(e, "device_type", None) == DeviceType.CPU

    kernels = sorted((e for e in events if getattr(e, "device_type", None) == DeviceType.CUDA
                      and not getattr(e, "is_user_annotation", False) and not _is_memop(e)),
                     key=lambda e: e.time_range.start)
    marker = next((k for k in kernels if "spin" in k.name.lower() or "sleep" in k.name.lower()), None)
    if marker is None:
        return None
    main = marker.device_resource_id
    side = [k for k in kernels if k is not marker and k.device_resource_id != main]
    counts: dict = {}
    for k in side:
        counts[k.device_resource_id] = counts.get(k.device_resource_id, 0) + 1
    chosen = pick_streams(counts, missing)
    first = next((k for k in side if k.device_resource_id in chosen), None)
    if first is None:
        return None
    out = {"kernel": first.name[:200], "stream_kernels": sum(counts[s] for s in chosen)}
    # the launching op: a front-end CPU event (not itself linked) whose id is the kernel's linked id;
    # failing that, the CPU ops that list the kernel by name, the latest one starting before it
    link = getattr(first, "linked_correlation_id", 0)
    ops = [e for e in events if is_cpu(e) and e.id == link and not getattr(e, "linked_correlation_id", 0)]
    ops += sorted((e for e in events if is_cpu(e) and e.time_range.start <= first.time_range.start
                   and any(getattr(k, "name", None) == first.name for k in getattr(e, "kernels", ()))),
                  key=lambda e: -e.time_range.start)
    for op in ops:
        site = stack_site(getattr(op, "stack", None))
        if site:
            out.update(site, op=op.name)
            return out
    names = [op.name for op in ops]
    for name in names:
        site = next((s for n, s in sites if n == name), None)
        if site:
            out.update(site, op=name)
            return out
    if sites and not names:  # no launching op found: the first side-stream op is the best lead
        out.update(sites[0][1], op=sites[0][0])
    return out
