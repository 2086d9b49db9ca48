"""The trace a scan leaves: one OpRecord per event of each audited step. Detectors read only this.

Plain data, kept apart from the tracer that fills it, so that reading a trace never runs tracing
machinery.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch

__all__ = ["OpRecord", "TensorMeta", "Trace"]


class TensorMeta(NamedTuple):  # a tuple: cheap to build once per tensor per op
    shape: tuple
    stride: tuple
    dtype: torch.dtype
    device: torch.device
    ptr: int      # data_ptr(): what a graph bakes
    sid: int      # StorageImpl address; unique for the whole scan (we hold a weak ref)
    tid: int      # TensorImpl address: "produced earlier in this step" check
    pinned: bool | None = None  # CPU tensors in a CUDA scan
    sparse: str = ""  # a COO tensor: "coo" (uncoalesced) or "coo-coalesced" (audit/scan/layouts.py)


@dataclass(slots=True)
class OpRecord:
    step: int
    index: int
    kind: str        # "aten" | "host" (Tensor.item, ...) | "sync" (torch.cuda.synchronize, ...) | "setattr" | "warn"
    op: str          # "aten.add", "Tensor.tolist", "torch.cuda.synchronize", "setattr"
    args: tuple      # normalized non-tensor args (tensors -> "<T>"), kwargs appended as (name, value)
    inputs: tuple = ()
    outputs: tuple = ()
    in_step: tuple = ()   # per input: produced by an earlier op of this step
    new: tuple = ()       # per output: its storage was created by this op
    module: str = ""
    stack: tuple = ()     # frames outside torch/audit/stdlib, outermost first: ((code, lineno), ...)
    func: object = None   # the OpOverload (kind "aten")
    nested: bool = False  # dispatched inside a host read (bool(t) -> _local_scalar_dense)
    note: str = ""
    host_scalars: tuple = ()  # (input index, value) of each 0-dim CPU tensor input: a kernel scalar on a GPU
    inside: str = ""  # host reads made by torch's own Python code: the torch functions, innermost with its line
    thread: int = 0   # 0: run by the step's own thread; else which of the step's hand-overs (1, 2, ...) a worker ran
    torch_site: tuple = ()  # a lift_fresh called from torch's own Python code: its (file, line) frames (torch_frames.torch_lines)

    @property
    def frame(self) -> tuple[str, int, str] | None:
        """(file, line, function) of the innermost user frame."""
        if not self.stack:
            return None
        code, line = self.stack[-1]
        return code.co_filename, line, code.co_name


@dataclass
class Trace:
    device: str
    steps: list = field(default_factory=list)          # per audited step: list[OpRecord]
    complete: list = field(default_factory=list)       # per audited step: finished without raising
    born: dict = field(default_factory=dict)           # sid -> (step, index) of the op that created it
    changes: list = field(default_factory=list)        # per audited step: list[state.StateChange]
    staged: list = field(default_factory=list)         # per audited step: what changed since the last one ended
    objects: list = field(default_factory=list)        # state.reachable(target)
    held: list = field(default_factory=list)           # per audited step: sids held by reachable objects before it
    seconds: float = 0.0                               # wall time inside audited steps
    codes: dict = field(default_factory=dict)          # id(code) -> (code, kind): user_code.HIDDEN/LIBRARY/OWN
    roots: tuple = ()                                  # the target's own folders/files (normalized)
    hook_calls: list = field(default_factory=list)     # per audited step: (hooks, module, stack) per hooked module call
    flags: dict = field(default_factory=dict)          # (file, if line, flag) -> truth values seen (scan.branch_flags)
    default_device: bool = False                       # torch.set_default_device(...) in force in an audited step
    ran_lines: list = field(default_factory=list)      # per audited step: (file, line) run where a host RNG can draw
    settings_span: dict = field(default_factory=dict)  # step -> {setting: (value at start, value at end)} (settings_hooks)

    def is_own(self, code) -> bool:
        """The code object is in the target's own files (or the model package)."""
        ent = self.codes.get(id(code))
        return ent is not None and ent[0] is code and ent[1] == 2

    def own_frames(self, stack) -> list:
        """The (code, line) frames of a stack that are the target's own."""
        return [f for f in stack if self.is_own(f[0])]

    @property
    def n_ops(self) -> int:
        return sum(len(s) for s in self.steps)

    def complete_steps(self) -> list[int]:
        return [i for i, ok in enumerate(self.complete) if ok]
