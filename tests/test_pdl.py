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


def _ptx(fn, signature: dict, constexprs: dict, aligned: tuple[str, ...] = (), warps: int = 4) -> str:
    """sm_90 PTX of fn; `aligned` names the arguments a launch specializes as multiples of 16 (pointers,
    K, row strides), as Triton does at run time, so the loads vectorize as they will on the GPU."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = list(signature)
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    src = ASTSource(fn=fn, signature=signature | dict.fromkeys(constexprs, "constexpr"), constexprs=constexprs,
                    attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps}).asm["ptx"]


_REG = re.compile(r"%[a-z]+\d+")


def _reads_before_wait(ptx: str, names: list[str]) -> list[set[str]]:
    """For each global load ahead of griddepcontrol.wait: the kernel arguments its address derives from
    (a def-use walk over the straight-line PTX in front of the wait)."""
    body = ptx[ptx.index(".entry"):]
    deps: dict[str, set[str]] = {}
    reads = []
    for line in body[:body.index("griddepcontrol.wait")].split(";"):
        line = re.sub(r"//[^\n]*", "", line).strip()
        line = re.sub(r"^@!?%p\d+\s*", "", line.split("\n")[-1].strip())
        if not line or line.startswith((".", "$", "{", "}")):
            continue
        op, _, args = line.partition(" ")
        src = {names[int(m)] for m in re.findall(r"_param_(\d+)", args)}
        head, _, rest = (args[1:].partition("}") if args.startswith("{") else args.partition(","))
        used = src.union(*(deps.get(r, set()) for r in _REG.findall(rest)))
        if op.startswith("ld.global"):
            reads.append(used)
        for r in _REG.findall(head):
            deps[r] = used
    return reads


GEMV_ARGS = dict(zip(["x_ptr", "w_ptr", "y_ptr", "ws_ptr", "cnt_ptr", "M", "N", "K", "K_PER_SPLIT", "sxm", "swn",
                      "sym", "sys"], ["*fp32", "*bf16", "*fp32", "*fp32", "*i32"] + ["i32"] * 8))
GEMV_ALIGNED = ("x_ptr", "w_ptr", "y_ptr", "ws_ptr", "cnt_ptr", "K", "K_PER_SPLIT", "sxm", "swn", "sym", "sys")
MIX_ARGS = dict(zip(["x_ptr", "f_ptr", "y_ptr", "ws_ptr", "cnt_ptr", "T", "J", "K", "K_PER_SPLIT", "sxt", "sfj",
                     "syt", "sys"], ["*bf16", "*fp32", "*fp32", "*fp32", "*i32"] + ["i32"] * 8))
MIX_ALIGNED = ("x_ptr", "f_ptr", "y_ptr", "ws_ptr", "cnt_ptr", "K", "K_PER_SPLIT", "sxt", "sfj", "sys")


def _gemv_cases():
    from dsv4.kernels import _triton_gemv as G, _triton_mixes as X

    return {"bf16 CUDA cores": (G._bf16_gemv_kernel, GEMV_ARGS, GEMV_ALIGNED, dict(BLOCK_M=1, BLOCK_N=64, BLOCK_K=128), "w_ptr"),
            "bf16 tensor cores": (G._bf16_gemv_tc_kernel, GEMV_ARGS, GEMV_ALIGNED, dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=64),
                                  "w_ptr"),
            "mixes": (X._mix_sums_kernel, MIX_ARGS, MIX_ALIGNED, dict(BLOCK_T=1, BLOCK_J=32, BLOCK_K=128, CHUNK=32, DOT=False),
                      "f_ptr"),
            "mixes dot": (X._mix_sums_kernel, MIX_ARGS, MIX_ALIGNED, dict(BLOCK_T=16, BLOCK_J=32, BLOCK_K=64, CHUNK=16, DOT=True),
                          "f_ptr")}


@pytest.mark.parametrize("case", ["bf16 CUDA cores", "bf16 tensor cores", "mixes", "mixes dot"])
@pytest.mark.parametrize("pdl", [False, True])
def test_weight_kernels_read_only_the_weight_before_the_wait(case, pdl):
    """The weight kernels load their first weight tile ahead of the PDL wait (it streams while the previous
    kernel ends) and nothing else: the activation, the split workspace and every store come after it."""
    pytest.importorskip("triton.backends.nvidia")
    fn, args, aligned, consts, weight = _gemv_cases()[case]
    ptx = _ptx(fn, args, consts | {"PDL": pdl, "PREFETCH": pdl}, aligned)
    body = ptx[ptx.index(".entry"):]
    wait = body.find("griddepcontrol.wait")
    assert (wait >= 0) == pdl
    if pdl:
        reads = _reads_before_wait(ptx, list(args))
        assert reads, "no weight load ahead of the wait"
        assert all(r & {n for n, t in args.items() if t.startswith("*")} == {weight} for r in reads), reads
        off = _ptx(fn, args, consts | {"PDL": True, "PREFETCH": False}, aligned)  # DSV4_PREFETCH=0: nothing ahead
        assert _reads_before_wait(off, list(args)) == []
        first_store = min(m.start() for m in re.finditer(r"\b(st|atom|red)\.global", body))
        assert wait < first_store
        assert wait < body.find("griddepcontrol.launch_dependents")
