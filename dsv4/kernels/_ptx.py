"""Inline-PTX helpers for the weight-only GEMV kernels (imports cutlass: load lazily).

Why PTX and not DSL arithmetic: Hopper has no e2m1 conversion instruction, and the cheapest exact
decode we know is a bit trick plus the sm_89+ `cvt.rn.f16x2.e4m3x2`:

    e2m1 nibble s.e1.e0.m  ->  e4m3 byte s.000.e1.e0.m.00  (value exactly e2m1 * 2^-6)

e4m3 has bias 7 and e2m1 bias 1, so shifting the exponent/mantissa bits into the e4m3 fields
divides every normal value by 2^6, and the e2m1 subnormal (0.5 = 0.1 * 2^0) lands on the e4m3
subnormal 0.100 * 2^-6 = 0.5 * 2^-6: the same factor. The hardware then turns the e4m3 pair into
an f16 pair (exact) and `cvt.f32.f16` into fp32 (exact). The 2^6 goes back into the block scale.
Five integer ops, two pair conversions and eight f16->f32 conversions per 8 weights, all in
registers: no lookup table, nothing in shared memory.

Element order is fixed and tested: byte b of a 32-bit word holds elements 2b (low nibble) and
2b+1 (high nibble); `cvt.rn.f16x2.e4m3x2` puts the low byte in the low half.
"""

from __future__ import annotations

from cutlass import Float32, Int32
from cutlass._mlir import ir
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

__all__ = ["e2m1x8_to_f32", "e4m3x4_to_f32", "bf16x2_to_f32", "ffma", "e8m0_to_f32_x64",
           "e4m3x2_to_f32", "absmax_f32", "act_block_scale", "e4m3_round_x2", "e4m3_round_bf16x2"]


def _asm(n_out: int, args: list, body: str, constraints: str):
    ty = llvm.StructType.get_literal([T.f32()] * n_out) if n_out > 1 else T.f32()
    res = llvm.inline_asm(ty, args, body, constraints, has_side_effects=False,
                          is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)
    if n_out == 1:
        return Float32(res)
    return tuple(Float32(llvm.extractvalue(T.f32(), res, [i])) for i in range(n_out))


def _i32(v, loc, ip) -> ir.Value:
    return Int32(v).ir_value(loc=loc, ip=ip)


def e2m1_to_e4m3_ptx(src: str) -> str:
    """PTX lines turning the word `src` of 8 packed e2m1 into e4m3 bytes: l0, l1 (elements 0, 2 | 4, 6) and
    h0, h1 (1, 3 | 5, 7), each value e2m1 * 2^-6. Needs .b32 t, u, lo, hi and .b16 l0, l1, h0, h1."""
    return f"""    shl.b32 t, {src}, 2;
    and.b32 t, t, 0x1C1C1C1C;
    shl.b32 u, {src}, 4;
    and.b32 u, u, 0x80808080;
    or.b32 lo, t, u;
    shr.u32 t, {src}, 2;
    and.b32 t, t, 0x1C1C1C1C;
    and.b32 u, {src}, 0x80808080;
    or.b32 hi, t, u;
    mov.b32 {{l0, l1}}, lo;
    mov.b32 {{h0, h1}}, hi;"""


@dsl_user_op
def e2m1x8_to_f32(w, *, loc=None, ip=None):
    """8 packed e2m1 (one 32-bit word) -> 8 fp32 = value * 2^-6, elements 0..7 in order."""
    body = """{
    .reg .b32 t, u, lo, hi, f0, f1, f2, f3;
    .reg .b16 l0, l1, h0, h1, a0, a1, a2, a3, a4, a5, a6, a7;
""" + e2m1_to_e4m3_ptx("$8") + """
    cvt.rn.f16x2.e4m3x2 f0, l0;
    cvt.rn.f16x2.e4m3x2 f1, l1;
    cvt.rn.f16x2.e4m3x2 f2, h0;
    cvt.rn.f16x2.e4m3x2 f3, h1;
    mov.b32 {a0, a2}, f0;
    mov.b32 {a4, a6}, f1;
    mov.b32 {a1, a3}, f2;
    mov.b32 {a5, a7}, f3;
    cvt.f32.f16 $0, a0;
    cvt.f32.f16 $1, a1;
    cvt.f32.f16 $2, a2;
    cvt.f32.f16 $3, a3;
    cvt.f32.f16 $4, a4;
    cvt.f32.f16 $5, a5;
    cvt.f32.f16 $6, a6;
    cvt.f32.f16 $7, a7;
}"""
    return _asm(8, [_i32(w, loc, ip)], body, "=f,=f,=f,=f,=f,=f,=f,=f,r")


@dsl_user_op
def e4m3x4_to_f32(w, *, loc=None, ip=None):
    """4 e4m3 bytes (one 32-bit word, byte b = element b) -> 4 fp32, exact."""
    body = """{
    .reg .b32 f0, f1;
    .reg .b16 l0, l1, a0, a1, a2, a3;
    mov.b32 {l0, l1}, $4;
    cvt.rn.f16x2.e4m3x2 f0, l0;
    cvt.rn.f16x2.e4m3x2 f1, l1;
    mov.b32 {a0, a1}, f0;
    mov.b32 {a2, a3}, f1;
    cvt.f32.f16 $0, a0;
    cvt.f32.f16 $1, a1;
    cvt.f32.f16 $2, a2;
    cvt.f32.f16 $3, a3;
}"""
    return _asm(4, [_i32(w, loc, ip)], body, "=f,=f,=f,=f,r")


@dsl_user_op
def e4m3x2_to_f32(w, *, loc=None, ip=None):
    """The two e4m3 bytes in the low 16 bits of w -> 2 fp32 (NVFP4 block scales)."""
    body = """{
    .reg .b32 f0;
    .reg .b16 l0, l1, a0, a1;
    mov.b32 {l0, l1}, $2;
    cvt.rn.f16x2.e4m3x2 f0, l0;
    mov.b32 {a0, a1}, f0;
    cvt.f32.f16 $0, a0;
    cvt.f32.f16 $1, a1;
}"""
    return _asm(2, [_i32(w, loc, ip)], body, "=f,=f,r")


@dsl_user_op
def bf16x2_to_f32(w, *, loc=None, ip=None):
    """A word of two bf16 (element 2j low, 2j+1 high) -> 2 fp32, exact (a shift and a mask)."""
    body = """{
    .reg .b32 t;
    shl.b32 t, $2, 16;
    mov.b32 $0, t;
    and.b32 t, $2, 0xFFFF0000;
    mov.b32 $1, t;
}"""
    return _asm(2, [_i32(w, loc, ip)], body, "=f,=f,r")


@dsl_user_op
def ffma(a, b, c, *, loc=None, ip=None):
    """fma.rn.f32 (denormals kept, no ftz): a * b + c."""
    args = [Float32(v).ir_value(loc=loc, ip=ip) for v in (a, b, c)]
    return _asm(1, args, "fma.rn.f32 $0, $1, $2, $3;", "=f,f,f,f")


@dsl_user_op
def e8m0_to_f32_x64(b, valid, *, loc=None, ip=None):
    """UE8M0 byte b -> 2^(b-127) * 2^6 as fp32 bits ((b+6) << 23), or 0 where valid == 0.

    Exact for b <= 248 (b = 0 included: 2^-121 is normal), which covers every scale the
    released quantizer produces; the 2^6 undoes the e2m1 -> e4m3 decode factor. `valid`
    zeroes the contribution of a clamped tail chunk without a branch.
    """
    body = """{
    .reg .b32 t;
    .reg .pred p;
    add.u32 t, $1, 6;
    shl.b32 t, t, 23;
    setp.ne.s32 p, $2, 0;
    selp.b32 $0, t, 0, p;
}"""
    return _asm(1, [_i32(b, loc, ip), _i32(valid, loc, ip)], body, "=f,r,r")


# ---------------------------------------------------------------- the FP8 activation rounding, in registers
# fp8_fake_quant(x, 128) inside the GEMV: a 128 block of x is spread over `lanes` consecutive lanes of
# one warp step (8 for the FP8 GEMV's 16-element chunks, 4 for the experts' 32-element chunks), so its
# amax is a butterfly max over those lanes; the scale is built from fp32 bits as `ue8m0_scale` does, and
# the rounding is the hardware's e4m3 conversion (round to nearest even, saturating at 448).


@dsl_user_op
def absmax_f32(xs, *, loc=None, ip=None):
    """max |x| over the fp32 values xs (a NaN is skipped, as max.f32 does)."""
    n = len(xs)
    steps = "".join(f"    abs.f32 a, ${i + 1};\n    max.f32 m, m, a;\n" for i in range(1, n))
    body = "{\n    .reg .f32 a, m;\n    abs.f32 m, $1;\n" + steps + "    mov.f32 $0, m;\n}"
    args = [Float32(v).ir_value(loc=loc, ip=ip) for v in xs]
    return _asm(1, args, body, "=f," + ",".join(["f"] * n))


@dsl_user_op
def act_block_scale(m, lanes: int, *, loc=None, ip=None):
    """The lane's partial amax m -> (s, 1/s) of its 128 block (`lanes` lanes, a power of two, aligned):
    s = 2^ceil(log2(fl(max(amax, 1e-4) / 448))), the exponent read off the quotient's bits (+1 unless
    its mantissa is zero), the division IEEE-rounded (div.rn) as torch's. Every lane must call it."""
    shuffles = "".join(f"    shfl.sync.bfly.b32 t, m, {o}, 0x1f, 0xffffffff;\n    max.f32 m, m, t;\n"
                       for o in (1, 2, 4, 8, 16) if o < lanes)
    body = """{
    .reg .f32 m, t, y;
    .reg .b32 b, e, c;
    .reg .pred p;
    mov.f32 m, $2;
""" + shuffles + """    max.f32 y, m, 0f38D1B717;
    div.rn.f32 y, y, 0f43E00000;
    mov.b32 b, y;
    shr.u32 e, b, 23;
    and.b32 e, e, 255;
    and.b32 c, b, 8388607;
    setp.ne.u32 p, c, 0;
    selp.u32 c, 1, 0, p;
    add.u32 e, e, c;
    shl.b32 b, e, 23;
    mov.b32 $0, b;
    mov.u32 c, 254;
    sub.u32 e, c, e;
    shl.b32 b, e, 23;
    mov.b32 $1, b;
}"""
    return _asm(2, [Float32(m).ir_value(loc=loc, ip=ip)], body, "=f,=f,f")


@dsl_user_op
def e4m3_round_x2(a, b, s, inv, *, loc=None, ip=None):
    """(a, b) -> e4m3(a * inv) * s, e4m3(b * inv) * s: fp8_fake_quant's value of each (exact products:
    s and inv are powers of two; e4m3 -> f16 -> f32 exact)."""
    body = """{
    .reg .f32 u, v;
    .reg .b16 p, h0, h1;
    .reg .b32 h;
    mul.f32 u, $2, $5;
    mul.f32 v, $3, $5;
    cvt.rn.satfinite.e4m3x2.f32 p, u, v;
    cvt.rn.f16x2.e4m3x2 h, p;
    mov.b32 {h0, h1}, h;
    cvt.f32.f16 u, h1;
    cvt.f32.f16 v, h0;
    mul.f32 $0, u, $4;
    mul.f32 $1, v, $4;
}"""
    args = [Float32(v).ir_value(loc=loc, ip=ip) for v in (a, b, s, inv)]
    return _asm(2, args, body, "=f,=f,f,f,f,f")


@dsl_user_op
def e4m3_round_bf16x2(w, s, inv, *, loc=None, ip=None):
    """A word of two bf16 -> the same two rounded as `e4m3_round_x2` does, packed back as bf16 (exact: an
    e4m3 value times a power of two has 4 significant bits; `prmt` keeps each fp32's high half)."""
    body = """{
    .reg .f32 a, b, u, v;
    .reg .b16 p, h0, h1;
    .reg .b32 h;
    shl.b32 h, $1, 16;
    mov.b32 a, h;
    and.b32 h, $1, 0xFFFF0000;
    mov.b32 b, h;
    mul.f32 u, a, $3;
    mul.f32 v, b, $3;
    cvt.rn.satfinite.e4m3x2.f32 p, u, v;
    cvt.rn.f16x2.e4m3x2 h, p;
    mov.b32 {h0, h1}, h;
    cvt.f32.f16 u, h1;
    cvt.f32.f16 v, h0;
    mul.f32 u, u, $2;
    mul.f32 v, v, $2;
    prmt.b32 $0, u, v, 0x7632;
}"""
    args = [_i32(w, loc, ip), Float32(s).ir_value(loc=loc, ip=ip), Float32(inv).ir_value(loc=loc, ip=ip)]
    res = llvm.inline_asm(T.i32(), args, body, "=r,r,f,f", has_side_effects=False,
                          is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)
    return Int32(res)
