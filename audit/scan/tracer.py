"""One tracer for the audited step; every detector reads the trace it leaves.

What would a CUDA graph see? Every aten op with its non-tensor arguments (baked into the graph), its tensors' shapes
and addresses (baked too), where their storage came from (this step, an earlier step, outside), plus the host reads
that never reach the dispatcher on a CPU tensor (`.tolist()`, `bool(t)`, ...) and explicit CUDA synchronizations.
Each event is attributed to the innermost frame of user code and to the module path that was running.

Hot path rule: no string formatting and no per-op allocation beyond the record itself; user-code classification is
cached per code object. Hooks, patches and modes live per audited step (removed in `finally`): prepare() and the
caller run untouched, also when the step raises."""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import os
import sys
import threading
import time
import warnings

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode

from audit.scan import composites, custom_ops, hops, layouts, module_stacks, op_args, wrappers
from audit.scan.patches import dist_hooks, hooks, module_hooks, threads
from audit.scan.snapshot import class_state, state
from audit.scan.sources import branch_flags, compiled_frames, loaded, torch_frames
from audit.scan.standins import cpu_cuda
from audit.scan.records import OpRecord, TensorMeta, Trace
from audit.scan.sources.user_code import HIDDEN, LIBRARY, frame_kind, is_user_file, norm_root

DIGEST_MAX = 1 << 16  # a host-built tensor up to this many values is compared by its data across steps
__all__ = ["Tracer"]

_LIFT = {"lift_fresh", "lift_fresh_copy"}  # torch.tensor(data) inside the step: host data
KEPT_ARRAY = "kept host array"  # a lift's note: it wraps a numpy array the target keeps (patches/zero_copy.py)
_OPNAMES: dict = {}  # OpOverload -> "aten.name"
_tuple_new = tuple.__new__


# ---------------------------------------------------------------------- the tracer
class Tracer:
    """Owns the trace of one scan. `with tracer.step(k): obj.step()` audits one step."""

    host_depth = threads.PerThread()  # inside a host read: its nested ops are the read's, not the step's
    cpu_checks = threads.PerThread()  # inside a call whose value reads happen on a CPU only

    def __init__(self, target, device: str, user_roots: tuple[str, ...] = (), gpu_trace: bool = False):
        self.target = target
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.gpu_trace = gpu_trace and self.cuda
        self.trace = Trace(device=str(self.device))
        importlib.import_module("torch._dynamo")  # the first dispatch-mode call imports it: not the step's cost
        self._roots = tuple(norm_root(r) for r in user_roots)
        self.trace.roots = self._roots
        self._user_code: dict = {}  # id(code) -> (code, kind): the kinds live in trace.codes too
        self._stop_code = Tracer.call.__code__
        self._pins: list = []            # StorageWeakRefs: keep StorageImpl addresses unique
        self._seen: dict[int, object] = {}
        self._names: dict = {}
        self._paths: dict = {}
        self._modules_state: list = []
        self._after: dict | None = None  # the state the last audited step ended with
        self._thread: int | None = None  # the thread that runs the audited step
        # per-step
        self._records: list = []
        self._produced: set = set()
        self._modstack = module_stacks.ModuleStacks()
        self._step, self.host_depth = -1, 0
        self.dist_works: list | None = None  # the step's collectives' Work objects (dist_hooks.issued)
        self.cpu_checks = 0  # inside a call whose value reads happen on a CPU only (one_hot's range check)
        self.kept_memory = False  # the next lift wraps a host array the target keeps (patches/zero_copy.kept_array)
        self._wlog: list | None = None
        self._flags = branch_flags.BranchFlags(self.trace.flags, on=not self.cuda)  # untaken device branches

    # ------------------------------------------------------------ helpers
    def is_user(self, filename: str) -> bool:
        return is_user_file(filename, self._roots)

    def stack(self, frame) -> tuple:
        """Frames outside torch, the audit and the stdlib, from `frame` outwards to the scan loop,
        outermost first: library frames (transformers, installed packages) and the target's own
        (which is which: trace.codes). The innermost is a finding's site, the innermost own its caller."""
        out = []
        cache, stop, flags, watched = self._user_code, self._stop_code, self._flags, self._flags.watched
        while frame is not None:
            code = frame.f_code
            if code is stop:
                break
            ent = cache.get(id(code))  # id, not the code object: hashing a code object hashes its bytecode
            if ent is None or ent[0] is not code:
                ent = cache[id(code)] = (code, frame_kind(code.co_filename, self._roots))
                self.trace.codes[id(code)] = ent  # keeps the code alive: its id stays unique
                if ent[1] != HIDDEN:  # a module loaded by path, outside sys.modules: its globals are state
                    loaded.note_globals(frame.f_globals)
                    flags.learn(code)
            if ent[1] != HIDDEN:
                out.append((code, frame.f_lineno))
                id(code) in watched and flags.note(code, frame, self._step)
            elif (fx := compiled_frames.fx_site(code, frame.f_lineno)) is not None:  # a GraphModule's forward
                out.append(self._known(fx))
            frame = frame.f_back
        out.reverse()
        if frame is None and self._thread is not None and threading.get_ident() != self._thread:
            # work the step handed to another thread (an output thread's detokenize()): the step's own stack
            # where it handed it over leads into it, else where the step's thread is (waiting with `.result()`)
            main = sys._current_frames().get(self._thread)
            return (threads.handed_from() or (self.stack(main) if main is not None else ())) + tuple(out)
        return tuple(out)

    def _known(self, site: tuple) -> tuple:
        """A (code, line) standing for source that ran without a frame of its own file (compiled_frames)."""
        code = site[0]
        if id(code) not in self.trace.codes:
            self.trace.codes[id(code)] = (code, frame_kind(code.co_filename, self._roots))
        return site

    def _discover(self) -> None:
        """What the step can reach, looked up right before the first audited step (after warmup,
        so caches and buffers created lazily by the first steps are included)."""
        self.trace.objects = state.reachable(self.target)
        self._names = state.module_names(self.trace.objects)
        self._paths = {id(o): p for p, o in self.trace.objects}
        self._modules_state = state.user_modules(self._roots)

    def path_of(self, obj) -> str:
        return self._paths.get(id(obj), type(obj).__name__)

    def call(self, fn):
        """Runs the audited callable; its frame bounds every recorded stack."""
        return fn()

    def _meta(self, t: torch.Tensor) -> TensorMeta:
        """Metadata of one tensor; sets self._fresh when its storage is seen for the first time."""
        try:
            st = t.untyped_storage()
            sid, ptr = st._cdata, t.data_ptr()
        except Exception:  # noqa: BLE001 - tensors without storage (sparse, meta, wrapper subclasses)
            sid = ptr = 0
        self._fresh = fresh = sid not in self._seen
        if fresh and sid:
            self._seen[sid] = None
            self._pins.append(StorageWeakRef(st))
        pinned = None
        if self.cuda and t.device.type == "cpu":
            with contextlib.suppress(Exception):
                pinned = t.is_pinned()
        shape, stride, sparse = layouts.shape_stride(t)  # nested and sparse CSR tensors lack sizes or strides
        return _tuple_new(TensorMeta, (shape, stride, t.dtype, t.device, ptr, sid, t._cdata, pinned, sparse))

    # ------------------------------------------------------------ recording
    def record_op(self, func, args, kwargs, out, failed: bool = False) -> None:
        tensors: list = []
        adopted = func._opname == "set_" and self._adopts_new_storage(args)
        norm = op_args.walk(args, tensors)
        if kwargs:
            norm = norm + tuple([(k, op_args.walk(v, tensors)) for k, v in kwargs.items()])
        meta = self._meta
        inputs = tuple([meta(t) for t in tensors])
        produced = self._produced
        in_step = wrappers.in_step(self, tensors, inputs, tuple([m.tid in produced for m in inputs]))  # DTensor
        name = _OPNAMES.get(func)
        if name is None:
            name = _OPNAMES[func] = f"{func.namespace}.{func._opname}"
        idx = len(self._records)
        if func._opname in _LIFT and tensors:  # torch.tensor(data) in the step: host data baked into it
            norm = ("value", self._small_values(tensors[0]))
            in_step = (False,) * len(inputs)  # the constructor's own copy, never an op's (even at a reused address)
            self.trace.born.setdefault(inputs[0].sid, (self._step, idx))
        outs: list = []
        if out is not None:
            op_args.walk(out, outs)
        out_metas, new = [], []
        if outs:
            in_sids = {m.sid for m in inputs}
            if adopted:  # set_(storage): the tensor now lives in storage first seen here (copy.deepcopy)
                in_sids.discard(inputs[0].sid)
            born = self.trace.born
            for t in outs:
                m = meta(t)
                fresh = (self._fresh or adopted) and m.sid not in in_sids
                if fresh:
                    born[m.sid] = (self._step, idx)
                produced.add(m.tid)
                out_metas.append(m)
                new.append(fresh)
            wrappers.note_outputs(self, outs, idx, tensors, new)  # a wrapper subclass's inner tensors are made here
        mod = self._modstack.top()
        stack = self.stack(sys._getframe(2))
        if (site := compiled_frames.script_site(stack, name)) is not None:  # inside a torch.jit.script function
            stack = stack + (self._known(site),)
        self._records.append(OpRecord(
            self._step, idx, "aten", name, norm, inputs, tuple(out_metas), in_step, tuple(new),
            mod, stack, func,
            self.host_depth > 0 or (self.cpu_checks > 0 and name == "aten._local_scalar_dense"),
            "failed" if failed else "", op_args.host_scalars(tensors, inputs),
            thread=0 if threading.get_ident() == self._thread else threads.handed_task() or 1 << 30))
        if func._opname in _LIFT and tensors:  # torch.tensor(data, device=...) written inside torch (torch.nested)
            self._records[-1].torch_site = torch_frames.torch_lines(sys._getframe(2), self._roots)
            if self.kept_memory:
                self._records[-1].note = KEPT_ARRAY

    def _adopts_new_storage(self, args) -> bool:
        """`t.set_(storage)` with a storage no op has shown yet and no attribute held before the step:
        storage allocated outside the dispatcher in the step (copy.deepcopy, UntypedStorage(n), clone of
        a storage) that set_ hands to a tensor. Its inputs are read after the op, so set_'s own self
        already carries the new storage and would not count as a new one."""
        src = args[1] if len(args) > 1 else None
        if not isinstance(src, (torch.UntypedStorage, torch.TypedStorage)):
            return False
        with contextlib.suppress(Exception):
            sid = (src._untyped_storage if isinstance(src, torch.TypedStorage) else src)._cdata
            held = self.trace.held[-1] if self.trace.held else ()
            return sid not in self._seen and sid not in held
        return False

    def _small_values(self, t: torch.Tensor):
        """The data of a tensor built from Python values (to diff it across steps): the values when
        there are few, else the first ones and a digest of all (a block table, a position list)."""
        n = t.numel()
        if n > DIGEST_MAX:
            return ("numel", n)
        values = self._read_values(t)
        if n <= 16 or values == ("unreadable",):
            return values
        digest = hashlib.blake2b(repr(values).encode(), digest_size=4).hexdigest()
        return values[:6] + (f"... {n} values #{digest}",)

    def _read_values(self, t: torch.Tensor) -> tuple:
        if t.device.type == "cpu":
            return tuple(hooks.ORIG["tolist"](t.flatten()))
        self.host_depth += 1  # our own read: not a finding, not a sync-debug warning
        try:
            with hooks.sync_debug_off():
                return tuple(hooks.ORIG["tolist"](t.flatten()))
        except Exception:  # noqa: BLE001 - a value we cannot read is still a value that varies
            return ("unreadable",)
        finally:
            self.host_depth -= 1

    def record_event(self, kind: str, op: str, tensor=None, note: str = "", depth: int | None = 2, stack=None) -> None:
        """A host read, a CUDA synchronization or a module setattr, at the caller's user frame (none: depth None;
        `stack` given: there)."""
        if self._step < 0:
            return
        mod = self._modstack.top()
        inputs = (self._meta(tensor),) if isinstance(tensor, torch.Tensor) else ()
        self._records.append(OpRecord(
            self._step, len(self._records), kind, op, (), inputs, (), (False,) * len(inputs), (),
            mod, stack if stack is not None else self.stack(sys._getframe(depth)) if depth is not None else (), note=note))

    def _script_read(self, frame, site, tensor) -> None:
        """A `.tolist()` a script ran below the dispatcher (compiled_frames.script_calls), at its line; the wait that
        sync-debug mode saw as the script returned (at the line that called it) is this read."""
        at = self.stack(frame)
        while self._records and self._records[-1].op == "sync-debug" and self._records[-1].stack == at:
            self._records.pop()
        self.record_event("host", "Tensor.tolist", tensor, stack=at + (self._known(site),))

    def _pre_hook(self, mod, args):
        self._modstack.push(self._names.get(id(mod)) or type(mod).__name__)
        if hs := module_hooks.hooks_of(mod, self):  # the hooks this call runs, and who called the module
            self.trace.hook_calls[-1].append((hs, mod, self.stack(sys._getframe(1))))

    def _post_hook(self, mod, args, out):
        self._modstack.pop()

    # ------------------------------------------------------------ one audited step
    @contextlib.contextmanager
    def step(self, k: int):
        """Audits everything run inside: dispatch mode, host-read patches, module hooks, setattr."""
        if not self.trace.objects:
            self._discover()
        before = class_state.snapshot(self.trace.objects, self._modules_state)
        self.trace.staged.append(state.diff(self._after, before) if self._after is not None else [])  # prepare()'s
        self.trace.held.append({self._meta(t).sid for _, t in state.tensor_attrs(self.trace.objects)})
        self._step, self._records, self._produced, self._modstack = k, [], set(), module_stacks.ModuleStacks()
        self._thread = threading.get_ident()
        self.trace.steps.append(self._records)
        self.trace.complete.append(False)
        self.trace.hook_calls.append([])
        t0 = time.perf_counter()  # (scan() runs the steps with Python's cyclic GC off: audit/scan/run.py)
        try:
            with contextlib.ExitStack() as stack:
                stack.enter_context(hooks.active(self))
                stack.callback(register_module_forward_pre_hook(self._pre_hook).remove)
                stack.callback(register_module_forward_hook(self._post_hook, always_call=True).remove)
                if self.cuda:
                    stack.callback(self._replay_warnings)  # runs after catch_warnings is gone
                    self._wlog = stack.enter_context(warnings.catch_warnings(record=True))
                    warnings.simplefilter("always")
                    stack.enter_context(hooks.sync_debug_warn())
                    if self.gpu_trace:
                        hooks.install_gpu_trace()
                if not self.cuda:
                    stack.enter_context(cpu_cuda.cpu_only_checks(self))
                stack.enter_context(compiled_frames.script_calls(lambda f: (self.stack(f) or ((None, 0),))[-1][0], self._script_read))
                stack.enter_context(_Mode(self))
                stack.enter_context(threads.traced_threads(lambda: _Mode(self), self.stack))
                yield
            self.trace.complete[-1] = True
        finally:
            self.trace.seconds += time.perf_counter() - t0
            self._step, self._thread, self._wlog = -1, None, None
            self._after = class_state.snapshot(self.trace.objects, self._modules_state)
            self.trace.changes.append(state.diff(before, self._after))
            self._add_ran_library_modules()

    def _add_ran_library_modules(self) -> None:
        """Installed modules (site-packages) whose code ran in the step: their globals are state from the
        next step on. `user_modules` leaves site-packages out (a step cannot be expected to touch most
        of it), yet a library's own global the step updates (a `@timed` decorator's TIMINGS dict, a
        metrics counter) is Python state a replay never updates, exactly like a user module's."""
        files = {code.co_filename for r in self._records for code, _ in r.stack
                 if self.trace.codes.get(id(code), (None, HIDDEN))[1] == LIBRARY}
        have = {id(m) for _, m in self._modules_state}
        for name, mod in loaded.loose_modules():  # own code loaded by path, first run this step
            if id(mod) not in have and self.is_user(mod.__file__):
                have.add(id(mod))
                self._modules_state.append((name, mod))
        files = {os.path.realpath(f) for f in files if not self.is_user(f)}
        if not files:
            return
        for name, mod in state.installed_modules(files):
            if id(mod) not in have:
                have.add(id(mod))
                self._modules_state.append((name, mod))

    def _replay_warnings(self) -> None:
        """Warnings the program emitted during the step that are not ours: show them as usual."""
        log, self._wlog = self._wlog or [], None
        for w in log:
            if "synchroniz" not in str(w.message).lower():
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)

    def close(self) -> None:
        """Drops the storage weak refs (frees the pinned StorageImpl shells)."""
        self._pins.clear()
        self._seen.clear()


class _Mode(TorchDispatchMode):
    supports_higher_order_operators = True  # torch.cond & co. come here (audit.scan.hops) instead of raising

    def __init__(self, tracer: Tracer):
        super().__init__()
        self.tracer = tracer

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if hops.is_hop(func):
            return hops.run(self, func, args, kwargs)
        body = custom_ops.python_body(func, args, kwargs, self.tracer._roots, types)
        if body is None and (whole := composites.parts(func, types, args)) is not None:  # handed over whole (inference mode)
            with self:
                return whole(*args, **(kwargs or {}))
        start = len(self.tracer._records)
        try:
            if body is not None:  # a custom op's Python body: its own ops are the step's ops too
                with self:
                    out = body(*args, **(kwargs or {}))
            else:
                out = func(*args, **(kwargs or {}))
        except BaseException:
            self.tracer.record_op(func, args, kwargs, None, failed=True)  # the op the step died in
            raise
        self.tracer.record_op(func, args, kwargs, out)
        if func.namespace == "c10d":  # a collective's Work: which later wait joins it
            dist_hooks.issued(self.tracer, func, out)
        if body is not None:  # the body's ops are records start.. of this step (detectors: body_of)
            self.tracer._records[-1].note = f"body:{start}"
        return out
