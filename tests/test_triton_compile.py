"""The newer Triton layer kernels compiled for the H200 (sm_90) on a machine without a GPU.

The interpreter (tests/test_triton_interpret.py) runs a kernel's arithmetic but not Triton's compiler,
which refuses some things the interpreter accepts (session 12: a `tl.constexpr` rebound in a static
loop passed every interpreter test and failed to compile on the GPU). Compiling to a cubin needs no
device: Triton ships ptxas. Each case is a real call's signature (flash shapes).
"""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton not installed")

SM90 = ("cuda", 90, 32)


def _compile(fn, types: dict, consts: dict) -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = dict(types) | {k: "constexpr" for k in consts}
    kernel = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts), target=GPUTarget(*SM90))
    assert kernel.asm["cubin"], fn.__name__


@pytest.mark.parametrize("hd,rounding,out", [(512, "kv", "*bf16"), (128, "index", "*bf16"), (512, "none", "*fp32")])
def test_entry_kernel_compiles_for_sm90(hd, rounding, out):
    from dsv4.kernels import _triton_entry as E

    types = dict(p_ptr="*fp32", w_ptr="*bf16", cos_ptr="*fp32", sin_ptr="*fp32", pos_ptr="*i64", out_ptr=out,
                 HD="i32", eps="fp32", spb="i32", sob="i32", sos="i32")
    _compile(E._entry_kernel, types, dict(M=4, PDL=True, **E.finish_args(hd, 64, rounding)))


@pytest.mark.parametrize("rounding", ["kv", "none"])
def test_attention_entry_kernel_compiles_for_sm90(rounding):
    from dsv4.kernels import _triton_entry as E, _triton_qkv as Q

    types = dict(q_ptr="*bf16", kv_ptr="*bf16", w_ptr="*bf16", cos_ptr="*fp32", sin_ptr="*fp32", pos_ptr="*i64",
                 qo_ptr="*bf16", win_ptr="*bf16", D="i32", W="i32", inv_d="fp32", q_eps="fp32", kv_eps="fp32",
                 sqb="i32", skb="i32", sob="i32", soh="i32", swb="i32", sws="i32")
    _compile(Q._qkv_kernel, types, dict(H=64, PDL=True, **E.finish_args(512, 64, rounding)))


def test_index_query_kernel_compiles_for_sm90():
    from dsv4.kernels import _triton_qkv as Q

    types = dict(q_ptr="*fp32", cos_ptr="*fp32", sin_ptr="*fp32", o_ptr="*bf16", sqb="i32", sob="i32", soh="i32")
    _compile(Q._index_q_kernel, types, dict(D=128, RD=64, LOG=7, IB=32, HSCALE=128 ** -0.5, PDL=True))


@pytest.mark.parametrize("block", [32, 256])
def test_gate_kernel_compiles_for_sm90(block):
    from dsv4.kernels import _triton_gate as G

    types = dict(l_ptr="*fp32", b_ptr="*fp32", w_ptr="*fp32", i_ptr="*i64", E="i32", k="i32", route_scale="fp32")
    _compile(G._gate_kernel, types, dict(BLOCK=block, PDL=True))


@pytest.mark.parametrize("ratio,overlap,hd,rounding", [(4, True, 512, "kv"), (4, True, 128, "index"),
                                                      (128, False, 512, "kv")])
def test_token_kernel_compiles_for_sm90(ratio, overlap, hd, rounding):
    import triton

    from dsv4.kernels import _triton_entry as E, _triton_token as T

    types = dict(kvn_ptr="*fp32", zn_ptr="*fp32", ape_ptr="*fp32", st_ptr="*fp32", pos_ptr="*i64", pool_ptr="*fp32",
                 w_ptr="*bf16", cos_ptr="*fp32", sin_ptr="*fp32", out_ptr="*bf16", HD="i32", C="i32", eps="fp32",
                 skn="i32", szn="i32", sape="i32", sb="i32", ss="i32", sob="i32", sos="i32")
    rows, C = (2 * ratio, 2 * hd) if overlap else (ratio, hd)
    consts = dict(M=ratio, R=rows, OVERLAP=overlap, APE=True, CB=triton.next_power_of_2(C),
                  BC=min(triton.next_power_of_2(hd), max(16, T.TILE // rows)), PDL=True, **E.finish_args(hd, 64, rounding))
    _compile(T._token_kernel, types, consts)


@pytest.mark.parametrize("tokens", [1, 16, 200])
def test_sinkhorn_and_comb_kernels_compile_for_sm90(tokens):
    from dsv4.kernels import _triton_sinkhorn as S

    consts = dict(HC=4, HP=4, BLOCK_T=S.block_t(tokens), PDL=True)
    _compile(S._sinkhorn_kernel, dict(x_ptr="*fp32", y_ptr="*fp32", T="i32", iters="i32", eps="fp32"), consts)
    _compile(S._comb_kernel, dict(s_ptr="*fp32", scale_ptr="*fp32", base_ptr="*fp32", y_ptr="*fp32", T="i32", K="i32",
                                  norm_eps="fp32", iters="i32", eps="fp32"), consts)


@pytest.mark.parametrize("block,nchunk,tail", [(8192, 1, 0), (8192, 2, 0), (4096, 1, 64), (64, 1, 16)])
def test_topk_select_kernel_compiles_for_sm90(block, nchunk, tail):
    from dsv4.kernels import _triton_topk as K

    types = dict(x_ptr="*fp32", v_ptr="*fp32", i_ptr="*i64", n="i32", k="i32")
    _compile(K._topk_select_kernel, types, dict(BLOCK=block, NCHUNK=nchunk, TAIL=tail, ALL=False, PDL=True))
