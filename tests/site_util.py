"""Planted targets written from a template: the line marked `# SITE` is where a finding must land."""

from __future__ import annotations

import random
import textwrap
from pathlib import Path


def write_target(path: Path, template: str, marker: str = "# SITE", **fields) -> tuple[Path, int]:
    """The target file from `template` (dedented, `fields` filled in) -> (its path, the marked line's number)."""
    path.write_text(textwrap.dedent(template).format(**fields))
    return path, marked_line(path, marker)


def matmul_target(step: str, imports: str = "", init: str = "", prepare: str = "") -> str:
    """The template of a small planted target ({seed} and {d} left to fill, with the caller's own fields): a
    seeded [d, d] weight `self.w`, a static input `self.x` refreshed in prepare(), a static output `self.out`.
    `step` is the step's body; `init` and `prepare` add lines to those methods (each line 8-space indented)."""
    return f"""
import torch
{imports}

class Target:
    def __init__(self):
        g = torch.Generator().manual_seed({{seed}})
        self.w = torch.randn({{d}}, {{d}}, generator=g) * 0.1
        self.x = torch.zeros(1, {{d}})
        self.out = torch.zeros(1, {{d}})
{init}

    def prepare(self, i):
        self.x.copy_(torch.randn(1, {{d}}))
{prepare}

    def step(self):
{step}

def make(device):
    return Target()
"""


def install_library(tmp_path: Path, monkeypatch, source: str, prefix: str = "lib", name: str | None = None):
    """A one-module third-party library for a planted target: `source` (dedented) as `name` (default
    `<prefix>_<random>`) in tmp_path/site, put on sys.path, with the target's own folder tmp_path/target
    made beside it, so the scan tells library and target apart. -> (module name, the library's file)."""
    mod = name or f"{prefix}_{random.randrange(10**9)}"
    libdir = tmp_path / "site"
    libdir.mkdir(exist_ok=True)
    lib = libdir / f"{mod}.py"
    lib.write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(libdir))
    (tmp_path / "target").mkdir(exist_ok=True)
    return mod, lib


def module_target(step: str, imports: str = "", init: str = "", prelude: str = "", prepare: str = "") -> str:
    """As matmul_target, for a target built from modules: torch seeded with {seed}, `init` making them (each
    line 8-space indented), a static input `self.x` and output `self.out` of width {d}, the step under
    no_grad (the modules' parameters want grad); `prelude` sits between the imports and the class,
    `prepare` adds lines to prepare()."""
    return f"""
import torch
from torch import nn
{imports}
{prelude}

class Target:
    def __init__(self):
        torch.manual_seed({{seed}})
{init}
        self.x = torch.zeros(1, {{d}})
        self.out = torch.zeros(1, {{d}})

    def prepare(self, i):
        self.x.copy_(torch.randn(1, {{d}}))
{prepare}

    @torch.no_grad()
    def step(self):
{step}

def make(device):
    return Target()
"""


def library_target(tmp_path: Path, monkeypatch, source: str, prefix: str, names: str, call: str,
                   out: str = "y", **template) -> tuple[str, Path, Path, int]:
    """The usual planted pair: `source` installed as a library (install_library), and a matmul target whose
    step sets `y = call` on its marked line and returns `out` copied into self.out (`template`: matmul_target's
    init / prepare), written with a fresh seed and size. -> (module name, library file, target path, the
    marked line)."""
    mod, lib = install_library(tmp_path, monkeypatch, source, prefix=prefix)
    tpl = matmul_target(imports=f"from {mod} import {names}", step=f"""        y = {call}  # SITE
        self.out.copy_({out})
        return self.out""", **template)
    path, site = write_target(tmp_path / "target" / f"lib_{prefix}.py", tpl, seed=random.randrange(2**31),
                              d=random.choice([4, 8, 16]))
    return mod, lib, path, site


def marked_line(path: Path, marker: str) -> int:
    return next(n for n, t in enumerate(path.read_text().splitlines(), 1) if marker in t)


def table(bad) -> str:
    """The findings a failed assertion shows."""
    return bad[["category", "line", "op", "message"]].to_string()


def scanned(path: Path, forget: str | None = None, **kwargs):
    """The inventory of a CPU scan of the target at path; `forget`: a planted library module dropped from
    sys.modules after the scan (each test plants a fresh one)."""
    import sys

    import audit

    try:
        return audit.scan(f"{path}:make", device="cpu", **kwargs)
    finally:
        if forget:
            sys.modules.pop(forget, None)


def blocking(path: Path, forget: str | None = None):
    """The blocking findings of a CPU scan of the target at path (see `scanned`)."""
    return scanned(path, forget).blocking()


def library_hit(bad, category: str, lib: Path, target: Path, caller: int, marker: str = "# LIBSITE"):
    """Asserts one `category` finding at the library's marked line, with the target's line `caller` as its
    caller; returns it."""
    hit = bad[(bad.category == category) & bad.file.str.endswith(lib.name) & (bad.line == marked_line(lib, marker))]
    assert len(hit) == 1, table(bad)
    assert hit.iloc[0].caller_file.endswith(target.name) and int(hit.iloc[0].caller_line) == caller, \
        hit[["caller_file", "caller_line"]].to_string()
    return hit


def clean_or_hit(bad, kind: str, category: str, lib: Path, target: Path, caller: int, marker: str = "# LIBSITE"):
    """A clean twin (kind "clean") has no blocking finding; any other kind has its one library_hit."""
    if kind == "clean":
        assert not len(bad), table(bad)
        return None
    return library_hit(bad, category, lib, target, caller, marker)


def at(bad, category: str, line: int):
    """The findings of one category at one line."""
    return bad[(bad.category == category) & (bad.line == line)]


# a one-function library `helper(y)` whose body starts from `z = torch.tanh(y)` ({body}, 4-space indented lines
# after the first), and a target calling it on its static input, its output written into a static buffer
HELPER_LIB = """
import torch


def helper(y):
    z = torch.tanh(y)
    {body}
"""

HELPER_TARGET = """
import torch
from {mod} import helper


class Target:
    def __init__(self):
        self.x = torch.zeros(2, {d})
        self.out = torch.zeros(2, {d})

    def prepare(self, i):
        self.x.copy_(torch.randn(2, {d}))

    def step(self):
        y = helper(self.x * {scale})  # SITE
        self.out[:, :y.shape[1]].copy_(y)
        return self.out


def make(device):
    return Target()
"""


# a target holding a library `Swap({n}, {block}, {d}, device, {pin})` (a host swap space beside a device block)
# and calling one of its methods on the step's device rows at the marked line
SWAP_TARGET = """
import torch
from {mod} import Swap

class Target:
    def __init__(self, device):
        torch.manual_seed({seed})
        self.w = torch.randn({d}, {d}, device=device)
        self.x = torch.zeros({block}, {d}, device=device)
        self.out = torch.zeros({block}, {d}, device=device)
        self.swap = Swap({n}, {block}, {d}, device, {pin})

    def prepare(self, i):
        self.x.copy_(torch.randn({block}, {d}))

    def step(self):
        y = self.swap.{method}(torch.tanh(self.x @ self.w), {slot})  # SITE
        self.out.copy_(y)
        return self.out

def make(device):
    return Target(device)
"""


# A weight-only quantized tensor subclass (int8 values and per-row scales in a wrapper), up to its dispatch table:
# the wrapper-subclass tests append their own `__torch_dispatch__`. `mark` ends the dequantize line (`  # LIBSITE`).
_QWEIGHT_HEAD = """
import torch

aten = torch.ops.aten


class QWeight(torch.Tensor):
    @staticmethod
    def __new__(cls, q, scale, transposed=False):
        shape = q.shape[::-1] if transposed else q.shape
        return torch.Tensor._make_wrapper_subclass(cls, shape, dtype=scale.dtype, device=q.device)

    def __init__(self, q, scale, transposed=False):
        self.q, self.scale, self.transposed = q, scale, transposed

    def __tensor_flatten__(self):
        return ["q", "scale"], (self.transposed,)

    @classmethod
    def __tensor_unflatten__(cls, inner, meta, size, stride):
        return cls(inner["q"], inner["scale"], *meta)

    def dequantize(self):
        w = self.q.to(self.scale.dtype) * self.scale[:, None]MARK
        return w.t() if self.transposed else w

    __torch_function__ = torch._C._disabled_torch_function_impl
"""


def qweight_head(mark: str = "") -> str:
    return _QWEIGHT_HEAD.replace("MARK", mark)


# The tail of a target whose step turns `self.x @ self.w` into logits, runs `{body}` on them and copies them
# into a fixed output buffer: the head (imports, __init__, prepare) is the test's own.
LOGITS_STEP = """
    @torch.no_grad()
    def step(self):
        logits = self.x @ self.w
{body}
        self.out.copy_(logits)
        return self.out


def make(device):
    return Target(device)
"""


STREAM_CAPTURING = """
import torch


def _stream_capturing():
    try:
        return torch.cuda.is_current_stream_capturing()
    except Exception:
        return False
"""  # a library's capture probe, as transformers writes it (its tracing helpers call it)


def helper_reads(tmp_path: Path, monkeypatch, lib_src: str, prefix: str):
    """The host-sync findings in a planted library (`lib_src`, called from HELPER_TARGET's marked line) of a CPU
    scan, after asserting they sit at the library's `# LIBSITE` line with that target line as their caller."""
    import sys

    import audit

    mod, lib = install_library(tmp_path, monkeypatch, lib_src, prefix)
    path, site = write_target(tmp_path / "target" / f"{prefix}_target.py", HELPER_TARGET, mod=mod,
                              d=random.choice([4, 8, 16]), scale=round(random.uniform(0.5, 2.0), 3))
    try:
        df = audit.scan(f"{path}:make", device="cpu").df
    finally:
        sys.modules.pop(mod, None)
    hit = df[(df.category == "host-sync") & df.file.str.endswith(lib.name)]
    assert set(hit.line) == {marked_line(lib, "# LIBSITE")}, hit.to_string()
    assert hit.caller_file.str.endswith(path.name).all() and (hit.caller_line == site).all(), hit.to_string()
    return hit


def one_read(path: Path, site: int, baked: bool):
    """Asserts one host-sync at the site of the scanned target, and a baked-host-value there exactly when
    `baked` (a value the code read itself, not one torch read inside the op); returns the blocking findings."""
    bad = blocking(path)
    assert len(at(bad, "host-sync", site)) == 1, table(bad)
    assert len(at(bad, "baked-host-value", site)) == (1 if baked else 0), table(bad)
    return bad



FED_STEP = """
    def prepare(self, i):
        {prepare}

    @torch.no_grad()
    def step(self):
        {take}  # SITE
        self.out.copy_(self.x @ self.w)
        return self.out


def make(device):
    return Target(device)
"""  # the tail of a target fed by a loader: prepare() runs {prepare}, the step {take}s its input on the SITE line


def captured_sampler(out: str, cls: str) -> str:
    """The tail of a sampler target whose `capture()` (which a scan never calls) registers generators and records
    the step: format fields `{register}` and `{draw}` stay open; the step returns `self.<out>`, make() a `<cls>`."""
    return """
    def capture(self):
        self.graph = torch.cuda.CUDAGraph()
        {register}
        with torch.cuda.graph(self.graph):
            self.step()

    def prepare(self, i):
        self.logits.copy_(torch.randn(B, V))

    def step(self):
        probs = torch.softmax(self.logits, dim=-1)
        {draw}
        return self.OUT


def make(device):
    return CLS()
""".replace("OUT", out).replace("CLS", cls)


# the head of a target class with seeded weights, an input and an output on the device (format fields {seed}, {d});
# a template goes on with more of `__init__`
SEEDED_TARGET = """class Target:
    def __init__(self, device):
        g = torch.Generator().manual_seed({seed})
        self.w = (torch.randn({d}, {d}, generator=g) * 0.1).to(device)
        self.x = torch.zeros(1, {d}, device=device)
        self.out = torch.zeros(1, {d}, device=device)
"""
