"""Inline-PTX pieces of the tensor-core expert GEMV (`_cute_mma.py`; imports cutlass: load lazily).

Why: the FP4 experts at batch 1 are bound by instruction issue, not bytes. The CUDA-core kernel spends
about 3.5 instructions per weight element (the e2m1 decode, two conversions to fp32, the FMA); here the
decode stops at f16 pairs and `mma.sync.m16n8k16` does the products and sums, 16 rows x 16 elements per
warp instruction.

Exactness: an e2m1 value times 2^-6 (the decode, see _ptx.py) has at most 2 significant bits and an e4m3
value at most 4, both exact in f16; their products are exact and the tensor core sums 16 of them into
fp32 (one MMA pair per 32-element scale block, started from zero; the block joins the running total in an
ordinary fp32 FMA with its scale).
"""

from __future__ import annotations

from cutlass import Float32, Int32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from dsv4.kernels._ptx import e2m1_to_e4m3_ptx
from dsv4.kernels._ptx_text import E2M1X8_BF16X2, E8M0_BF16X2

__all__ = ["e2m1x8_to_f16x2", "e4m3_q_f16x2", "mma_f16_16x8x16", "e8m0_x64", "e2m1x8_bf16x2", "e8m0_bf16x2",
           "mma_bf16_16x8x16"]


def _asm(n_out: int, out_ty, args: list, body: str, constraints: str):
    ty = llvm.StructType.get_literal([out_ty()] * n_out)
    res = llvm.inline_asm(ty, args, body, constraints, has_side_effects=False,
                          is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)
    wrap = Int32 if out_ty is T.i32 else Float32
    return tuple(wrap(llvm.extractvalue(out_ty(), res, [i])) for i in range(n_out))


@dsl_user_op
def e2m1x8_to_f16x2(w, *, loc=None, ip=None):
    """8 packed e2m1 (one word) -> four f16 pairs of value * 2^-6: (e0, e2), (e4, e6), (e1, e3), (e5, e7),
    the lower element in the low half (the order `mma_f16_16x8x16`'s operands are laid out in)."""
    body = """{
    .reg .b32 t, u, lo, hi;
    .reg .b16 l0, l1, h0, h1;
""" + e2m1_to_e4m3_ptx("$4") + """
    cvt.rn.f16x2.e4m3x2 $0, l0;
    cvt.rn.f16x2.e4m3x2 $1, l1;
    cvt.rn.f16x2.e4m3x2 $2, h0;
    cvt.rn.f16x2.e4m3x2 $3, h1;
}"""
    return _asm(4, T.i32, [Int32(w).ir_value(loc=loc, ip=ip)], body, "=r,=r,=r,=r,r")


@dsl_user_op
def e4m3_q_f16x2(a, b, inv, *, loc=None, ip=None):
    """The e4m3 values of a * inv and b * inv (fp8_fake_quant's rounding before its scale goes back on), as
    one f16 pair, a in the low half."""
    body = """{
    .reg .f32 u, v;
    .reg .b16 p;
    mul.f32 u, $1, $3;
    mul.f32 v, $2, $3;
    cvt.rn.satfinite.e4m3x2.f32 p, v, u;
    cvt.rn.f16x2.e4m3x2 $0, p;
}"""
    args = [Float32(v).ir_value(loc=loc, ip=ip) for v in (a, b, inv)]
    return _asm(1, T.i32, args, body, "=r,f,f,f")[0]


def _mma_16x8x16(ab: str, a, b, c, loc, ip):
    body = (f"mma.sync.aligned.m16n8k16.row.col.f32.{ab}.{ab}.f32 {{$0, $1, $2, $3}}, {{$4, $5, $6, $7}}, "
            "{$8, $9}, {$10, $11, $12, $13};")
    args = ([Int32(v).ir_value(loc=loc, ip=ip) for v in (*a, *b)]
            + [Float32(v).ir_value(loc=loc, ip=ip) for v in c])
    return _asm(4, T.f32, args, body, "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f")


@dsl_user_op
def mma_f16_16x8x16(a, b, c, *, loc=None, ip=None):
    """D = A B + C on tensor cores: A 16x16 f16 (four words a), B 16x8 f16 (two words b), C/D 16x8 fp32
    (four values), in mma.sync's fragment layout (lane = 4 g + t holds A rows g and g+8, B column g)."""
    return _mma_16x8x16("f16", a, b, c, loc, ip)


@dsl_user_op
def e8m0_x64(b, *, loc=None, ip=None):
    """A UE8M0 scale byte (0..254) -> its scale times 2^6 (the decode's 2^-6 undone), as fp32 bits
    (b + 6) << 23: two integer ops."""
    body = """{
    .reg .b32 t;
    add.u32 t, $1, 6;
    shl.b32 $0, t, 23;
}"""
    return _asm(1, T.f32, [Int32(b).ir_value(loc=loc, ip=ip)], body, "=f,r")[0]


@dsl_user_op
def e2m1x8_bf16x2(w, f, *, loc=None, ip=None):
    """8 packed e2m1 (one word) times the bf16 pair factor f -> four bf16 pairs: byte p's (low, high)
    nibbles = elements (2p, 2p + 1), the lower element in the low half (see _ptx_text.py)."""
    return _asm(4, T.i32, [Int32(v).ir_value(loc=loc, ip=ip) for v in (w, f)], E2M1X8_BF16X2, "=r,=r,=r,=r,r,r")


@dsl_user_op
def e8m0_bf16x2(b, *, loc=None, ip=None):
    """A UE8M0 scale byte b -> the bf16 pair factor of e2m1x8_bf16x2, 2^(b - 9), in both halves."""
    return _asm(1, T.i32, [Int32(b).ir_value(loc=loc, ip=ip)], E8M0_BF16X2, "=r,r")[0]


@dsl_user_op
def mma_bf16_16x8x16(a, b, c, *, loc=None, ip=None):
    """As mma_f16_16x8x16 with bf16 operands (the products exact in the fp32 result)."""
    return _mma_16x8x16("bf16", a, b, c, loc, ip)
