"""A model of the few PTX integer and bf16x2 instructions the inline expert decodes use, run on 32-bit
registers in order on the CPU: the decodes' bit tricks are tested value by value without a GPU."""

from __future__ import annotations


def run_ptx(asm: str, regs: dict[str, int]) -> dict[str, int]:
    """A few PTX instructions (the ones the nibble decode uses) on 32-bit registers, in order."""
    import numpy as np

    def val(tok: str) -> int:
        tok = tok.strip()
        return regs[tok] if tok in regs else int(tok, 0)

    def bf16x2(v: int):
        return np.array([v & 0xFFFF, v >> 16], dtype=np.uint32).__lshift__(16).view(np.float32).astype(np.float64)

    def pack(a, b) -> int:  # bf16 round-to-nearest-even of two exactly representable products (checked)
        out = 0
        for i, f in enumerate((a, b)):
            bits = int(np.array([f], dtype=np.float32).view(np.uint32)[0])
            assert bits & 0xFFFF == 0 and float(np.float32(f)) == f, f  # exact in bf16: no rounding to model
            out |= (bits >> 16) << (16 * i)
        return out

    for stmt in asm.replace("{", "").replace("}", "").split(";"):
        stmt = stmt.strip()
        if not stmt or stmt.startswith(".reg"):
            continue
        op, args = stmt.split(None, 1)
        d, *src = [a.strip() for a in args.split(",")]
        s = [val(a) for a in src]
        if op == "prmt.b32":
            pool = s[0].to_bytes(4, "little") + s[1].to_bytes(4, "little")
            out = 0
            for i in range(4):
                sel = (s[2] >> (4 * i)) & 0xF
                byte = pool[sel & 7]
                out |= ((0xFF if byte & 0x80 else 0) if sel & 8 else byte) << (8 * i)
            regs[d] = out
        elif op == "shl.b32":
            regs[d] = (s[0] << s[1]) & 0xFFFFFFFF
        elif op == "and.b32":
            regs[d] = s[0] & s[1]
        elif op == "add.u32":
            regs[d] = (s[0] + s[1]) & 0xFFFFFFFF
        elif op == "mul.lo.u32":
            regs[d] = (s[0] * s[1]) & 0xFFFFFFFF
        elif op == "mov.b32":
            regs[d] = s[0]
        elif op == "mul.rn.bf16x2":
            a, b = bf16x2(s[0]), bf16x2(s[1])
            regs[d] = pack(a[0] * b[0], a[1] * b[1])
        else:
            raise AssertionError(f"instruction {op} not modelled")
    return regs
