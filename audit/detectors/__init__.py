"""Detector registry: one module per hazard family, each rule a small function over one Trace.

Modelled on torch.utils.flop_counter: a decorator fills a registry keyed by category, and the
engine runs every registered rule over the same trace (the model ran once). A rule takes a
Context (the trace plus helpers for call sites and findings) and returns findings. Its docstring
says why the hazard matters under capture; the category table in audit.report.inventory has the fix.
"""

from __future__ import annotations

import importlib
import inspect
import os
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from audit.detectors.device import capturable_flags
from audit.detectors.device.cpu_only import cpu_side
from audit.report.inventory import CATEGORIES, Finding
from audit.scan.sources.user_code import OWN, display_path

__all__ = ["REGISTRY", "Context", "Rule", "register", "run"]

FAMILIES = ("host_sync", "guarded_sync", "allocation", "control", "baked", "stale_pointer", "side_effect", "rng",
            "cross_device", "pageable_copy", "host_data", "streams", "guarded_streams", "settings", "global_rng",
            "staging_refill", "step_host_buffers", "scalar_args", "hook_registrations", "sparse_sizes", "nested_masks",
            "host_clock", "cached_host", "runtime_syncs", "grouped_mm", "optimizer_capture", "linalg_kernels",
            "kernel_checks", "counter_branches", "read_branches", "collective_joins", "sized_loops", "guarded_uploads",
            "gpu_kernels", "rnn_flatten", "tensors.rare_counter_reads")


@dataclass(frozen=True)
class Rule:
    category: str
    name: str
    fn: Callable[[Context], Iterable[Finding]]
    cuda_only: bool
    doc: str


REGISTRY: dict[str, list[Rule]] = defaultdict(list)


def register(category: str, *, cuda_only: bool = False):
    """Registers `fn(ctx) -> Iterable[Finding]` as a rule of `category`."""
    if category not in CATEGORIES:
        raise ValueError(f"unknown category {category!r}")

    def deco(fn):
        if any(r.fn is fn for r in REGISTRY[category]):
            return fn
        REGISTRY[category].append(Rule(category, fn.__name__, fn, cuda_only, inspect.getdoc(fn) or ""))
        return fn

    return deco


def _load() -> None:
    for fam in FAMILIES:
        importlib.import_module(f"audit.detectors.{fam}")


# categories whose hazard is what the op at the site does (not the state it reads: a stale input is stale
# whichever side reads it), so an op a GPU never runs is none on a GPU (device/cpu_only.py)
_WHAT_THE_OP_DOES = frozenset({"host-sync", "step-allocation", "data-dependent-control", "baked-host-value",
                               "dynamic-shape", "cpu-side-effect", "rng", "cross-device", "pageable-copy",
                               "lazy-init"})


class Context:
    """The shared trace plus what every rule needs: aligned call sites, paths, finding builders."""

    def __init__(self, trace, target_obj=None, cwd: str | None = None, cuda: bool = False):
        self.trace = trace
        self.cuda = cuda  # the scan ran on a GPU (rules that only matter on a CPU scan skip)
        self.target = target_obj
        self.cwd = os.path.realpath(cwd or os.getcwd())
        self.steps = trace.steps
        self.complete = trace.complete_steps()
        self.n_steps = max(len(trace.steps), 1)
        self._sites: dict[int, dict] = {}
        self._rel: dict[str, str] = {}
        self._own: list[str] | None = None

    def own_files(self) -> list[str]:
        """The target's own source files whose code ran (sorted): where its constructions and stores are read."""
        if self._own is None:
            self._own = sorted({c.co_filename for c, kind in self.trace.codes.values() if kind == OWN})
        return self._own

    # ------------------------------------------------------------ call sites
    def ops(self, step: int):
        """Dispatched aten records of a step that are not the inside of a host read."""
        return [r for r in self.steps[step] if r.kind == "aten" and not r.nested]

    def sites(self, step: int) -> dict:
        """key -> record, key = (module, code, line, op, k-th occurrence of that in the step).

        This aligns 'the same call' across steps: layer loops differ by module path, repeated
        calls on one line by occurrence. Work handed to other threads counts after the step's own, in the
        order it was handed over (control._by_thread): which worker ran it first is scheduling."""
        if step not in self._sites:
            seen: dict = defaultdict(int)
            out = {}
            for r in sorted(self.ops(step), key=lambda r: r.thread):
                code, line = r.stack[-1] if r.stack else (None, 0)
                base = (r.module, id(code), line, r.op)  # id: hashing a code object hashes its bytecode
                out[base + (seen[base],)] = r
                seen[base] += 1
            self._sites[step] = out
        return self._sites[step]

    # ------------------------------------------------------------ attribution
    def rel(self, filename: str) -> str:
        """What a person opens: relative to the working directory when inside it, installed code as
        its package path (transformers/models/...), a target file outside both absolute."""
        if filename not in self._rel:  # a target file's folder is on sys.path, yet not an install location
            self._rel[filename] = display_path(filename, self.cwd, skip=self.trace.roots)
        return self._rel[filename]

    def where(self, rec) -> tuple[str, int, str]:
        fr = rec.frame if rec is not None else None
        if fr is None:
            return "<no user frame>", 0, ""
        return self.rel(fr[0]), fr[1], fr[2]

    def caller(self, rec) -> tuple[str, int, str] | None:
        """(file, line, function) of the innermost frame in the target's own files that led to the
        record's site (None: no own frame on the stack, e.g. an hf: target driven by the audit)."""
        for code, line in reversed(rec.stack if rec is not None else ()):
            if self.trace.is_own(code):
                return code.co_filename, line, code.co_name
        return None

    def caller_into(self, rec, file: str, function: str):
        """For a site found in the source (a branch, a mutation) in `function` of `file`: the target's
        own frame that called into that function on `rec`'s stack; None when the function is the
        target's own (the site is its own caller), `rec` itself when the function is not on it."""
        for k, (code, _) in enumerate(rec.stack):
            if code.co_filename == file and code.co_name == function:
                if self.trace.is_own(code):
                    return None
                own = [f for f in rec.stack[:k] if self.trace.is_own(f[0])]
                return (own[-1][0].co_filename, own[-1][1], own[-1][0].co_name) if own else None
        return rec

    def finding(self, category: str, at, op: str, count: float, message: str, *,
                severity: str | None = None, fix: str = "", module: str | None = None, caller=None,
                **extra) -> Finding:
        """`at` is an OpRecord or a (file, line, function) triple (the site); `caller` (a record or a
        triple) defaults to the innermost own frame of `at`'s stack, else the site itself."""
        if isinstance(at, tuple):
            file, line, fn = self.rel(at[0]) if at[0] and not at[0].startswith("<") else at[0], at[1], at[2]
        else:
            file, line, fn = self.where(at)
            module = at.module if module is None and at is not None else module
            caller = at if caller is None else caller
        cfr = self.caller(caller) if caller is not None and not isinstance(caller, tuple) else caller
        cf, cl, cfn = (self.rel(cfr[0]), int(cfr[1]), cfr[2]) if cfr else ("", 0, "")
        if not self.cuda and category in _WHAT_THE_OP_DOES and not isinstance(at, tuple) and at is not None and \
                (severity or CATEGORIES[category].severity) != "info" and \
                (cpu := cpu_side(at.stack) or capturable_flags.cpu_only(self, at)):
            severity = "info"  # traced on a side of a device test that a GPU does not take
            message += f"; on the CPU only: {cpu[1]} ({self.rel(cpu[0])}:{cpu[2]})"
        return Finding(category, severity or CATEGORIES[category].severity, file, int(line), fn,
                       module or "", op, round(float(count), 3), message, fix, cf, cl, cfn, extra=extra)

    def site_key(self, rec) -> tuple:
        """(site, op, caller line): the key rules group aligned calls by, so a library line reached from two
        of the target's lines (rotary's `arange(n) + offset` under `rotate(q, offset=pos)` and
        `rotate(k, offset=pos)`) is two findings, one per place to fix, as `per_site` groups records."""
        cfr = self.caller(rec)
        return self.where(rec), rec.op, cfr[:2] if cfr else None

    def per_site(self, records) -> dict:
        """Group records by (file, line, op, caller) over all audited steps. The caller is the target's
        own line that led there: a library line reached from two of the target's lines (PyG's
        `maybe_num_nodes` under `degree(dst)` and `softmax(score, dst)`) is two places to fix, not one."""
        groups: dict = defaultdict(list)
        for r in records:
            fr = r.frame
            cfr = self.caller(r)
            groups[(fr[0] if fr else "", fr[1] if fr else 0, r.op, cfr[:2] if cfr else None)].append(r)
        return groups

    def all_records(self, kinds=("aten",)):
        for recs in self.steps:
            for r in recs:
                if r.kind in kinds:
                    yield r


def run(trace, target_obj=None, cuda: bool = False) -> list[Finding]:
    """Every registered rule over the trace; a rule that crashes becomes a visible error, not a skip."""
    _load()
    from audit.detectors.host import factories

    ctx = Context(trace, target_obj, cuda=cuda)
    out: list[Finding] = []
    token = factories.DEFAULT_DEVICE_SET.set(getattr(trace, "default_device", False))
    try:
        for category in CATEGORIES:
            for rule in REGISTRY.get(category, ()):
                if rule.cuda_only and not cuda:
                    continue
                out.extend(rule.fn(ctx))
    finally:
        factories.DEFAULT_DEVICE_SET.reset(token)
    return _traced_first(out)


def _traced_first(found: list[Finding]) -> list[Finding]:
    """A branch the traced rule names (the steps forked there) drops the source rules' finding on the same line
    (op `if`: a counter or a read value the audited steps never turned): one branch, one finding."""
    traced = {(f.file, f.line, f.caller_file, f.caller_line) for f in found
              if f.category == "data-dependent-control" and f.op != "if"}
    return [f for f in found if not (f.category == "data-dependent-control" and f.op == "if"
                                     and (f.file, f.line, f.caller_file, f.caller_line) in traced)]
