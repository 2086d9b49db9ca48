"""PTX text of the tensor-core expert decode, kept free of cutlass so a CPU test can run it instruction by
instruction (tests/test_ptx_text.py); `_ptx_mma.py` wraps it for the CuTe kernels.

Scale folded into the weights: a nibble s.ee.m lands at bf16 bits s.0000000ee.m000000 (the value
e2m1 * 2^-126; ee = 0 is a bf16 subnormal, the same identity) and one mul.rn.bf16x2 by the factor
2^(b - 127 - 8 + 126) makes it e2m1 * scale * 2^-8: exact for UE8M0 bytes 10 <= b <= 136 (at most 2
significant bits, a normal bf16). The 2^8 goes back on the fp32 sums (FOLD).
prmt builds [low nibble's byte, its sign, high nibble's byte, its sign] from the word shifted left by 4 (a)
and the word itself (b): selector nibbles p, p|8, 4+p, (4+p)|8 for byte p (bit 3 replicates the byte's top
bit); one shift by 2 and one mask leave the two nibbles' bf16 bits in the two halves.
"""

FOLD = 256.0  # 2^8: the factor's 2^-8 undone on the fp32 result
_BYTE_SEL = (0xC480, 0xD591, 0xE6A2, 0xF7B3)

# $4: the packed word (byte p = elements 2p (low nibble), 2p + 1); $5: the factor pair; $0..$3: byte p's pair
E2M1X8_BF16X2 = "{\n    .reg .b32 t, d;\n    shl.b32 t, $4, 4;" + "".join(
    f"\n    prmt.b32 d, t, $4, {sel:#06x}; shl.b32 d, d, 2; and.b32 d, d, 0x81C081C0; mul.rn.bf16x2 ${p}, d, $5;"
    for p, sel in enumerate(_BYTE_SEL)) + "\n}"

# $1: a UE8M0 scale byte b -> $0: the bf16 factor 2^(b - 9) in both halves
E8M0_BF16X2 = "{\n    .reg .b32 t;\n    add.u32 t, $1, 118;\n    mul.lo.u32 $0, t, 0x00800080;\n}"
