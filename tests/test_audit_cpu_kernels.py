"""A custom op's kernel registered for the CPU only: what a CPU scan traces there a GPU never runs.

A custom op can carry one kernel per device: a `register_kernel("cpu")` reference path beside a device-generic
body, `custom_op(..., device_types="cpu")` with a `register_kernel("cuda")` (torch's own example), or
`Library.impl(name, cpu_fn, "CPU")` beside `impl(name, cuda_fn, "CUDA")`. A CPU scan runs the CPU kernel, whose
`.tolist()` it reported as a host-sync of the GPU step, though on a GPU the dispatcher picks the other kernel.
That is the CPU's side of a device choice, as `if x.is_cuda:` makes one: info, naming the kernel. A kernel the
GPU would run too (one function for both devices, or the generic body itself) is still the step's hazard.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, clean_or_hit, install_library, matmul_target, write_target

CUSTOM = """
import torch


@torch.library.custom_op("{ns}::rows", mutates_args=(){devices})
def rows(x: torch.Tensor) -> torch.Tensor:
    {generic}


@rows.register_fake
def _(x):
    return torch.empty_like(x)


@rows.register_kernel({other})
def _rows_other(x):
    {special}
"""

LIBRARY = """
import torch

lib = torch.library.Library("{ns}", "DEF")
lib.define("rows(Tensor x) -> Tensor")


def _rows_cpu(x):
    {reads}


def _rows_cuda(x):
    return x / x.abs().max()


lib.impl("rows", _rows_cpu, "CPU")
lib.impl("rows", {cuda}, "CUDA")
"""

READS = "return x / max(abs(v) for v in x.flatten().tolist())  # LIBSITE"
DEVICE = "return x / x.abs().max()"


def _source(style: str, kind: str, ns: str) -> str:
    if style == "library":
        return LIBRARY.format(ns=ns, reads=READS, cuda="_rows_cuda" if kind == "split" else "_rows_cpu")
    if style == "cpu_kernel":  # a generic body, and a reference path registered for the CPU (shared: and CUDA)
        return CUSTOM.format(ns=ns, devices="", generic=DEVICE, other='"cpu"' if kind == "split" else '("cpu", "cuda")',
                             special=READS)
    # torch's example: the body for the CPU only, a CUDA kernel beside it (shared: the kernel is for the XPU)
    return CUSTOM.format(ns=ns, devices=', device_types="cpu"' if kind == "split" else "", generic=READS,
                         other='"cuda"' if kind == "split" else '"xpu"', special=DEVICE)


@pytest.mark.parametrize("style", ["cpu_kernel", "cpu_body", "library"])
@pytest.mark.parametrize("kind", ["split", "shared"])
def test_kernel_for_the_cpu_only(tmp_path, monkeypatch, style, kind):
    ns = f"ck{random.randrange(10**9)}"
    mod, lib = install_library(tmp_path, monkeypatch, _source(style, kind, ns), prefix="ck")
    tpl = matmul_target(imports=f"import {mod}", step=f"""        y = torch.ops.{ns}.rows(self.x @ self.w)  # SITE
        self.out.copy_(y)
        return self.out""")
    path, site = write_target(tmp_path / "target" / "ck.py", tpl, seed=random.randrange(2**31), d=random.choice([4, 8]))
    bad = blocking(path, forget=mod)
    clean_or_hit(bad[bad.category == "host-sync"], "clean" if kind == "split" else "hit", "host-sync", lib, path, site)
