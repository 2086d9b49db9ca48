"""Programmatic dependent launch: where it is switched on, and that a PDL kernel waits before it
touches anything an earlier kernel wrote (sm_90 builds on the CPU: no GPU needed)."""

from __future__ import annotations

import re

import pytest
import torch

from dsv4.decode import fuse


def test_switch_reaches_inductor_options(monkeypatch):
    monkeypatch.setenv("DSV4_PDL", "0")
    assert "triton.enable_pdl" not in fuse.options()
    monkeypatch.setenv("DSV4_PDL", "1")
    from torch._inductor import config

    assert fuse.options().get("triton.enable_pdl", False) == hasattr(config.triton, "enable_pdl")


def test_no_pdl_off_the_gpu():
    pytest.importorskip("triton")
    from dsv4.kernels import _pdl

    assert _pdl.launch_args(torch.zeros(2)) == {"PDL": False}


def _ptx(fn, signature: dict, constexprs: dict) -> str:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    src = ASTSource(fn=fn, signature=signature | dict.fromkeys(constexprs, "constexpr"), constexprs=constexprs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"]


@pytest.mark.parametrize("pdl", [False, True])
def test_gemv_waits_before_its_first_access(pdl):
    pytest.importorskip("triton.backends.nvidia")
    from dsv4.kernels import _triton_gemv as G

    names = ["x_ptr", "w_ptr", "y_ptr", "ws_ptr", "cnt_ptr", "M", "N", "K", "K_PER_SPLIT", "sxm", "swn", "sym", "sys"]
    types = ["*fp32", "*bf16", "*fp32", "*fp32", "*i32"] + ["i32"] * 8
    ptx = _ptx(G._bf16_gemv_kernel, dict(zip(names, types)),
               {"BLOCK_M": 1, "BLOCK_N": 64, "BLOCK_K": 128, "PDL": pdl})
    body = ptx[ptx.index(".entry"):]
    wait = body.find("griddepcontrol.wait")
    assert (wait >= 0) == pdl
    if pdl:
        first_access = min(m.start() for m in re.finditer(r"\b(ld|st|atom|red)\.global", body))
        assert wait < first_access
        assert wait < body.find("griddepcontrol.launch_dependents")
