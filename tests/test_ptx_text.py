"""The tensor-core expert decode's PTX (dsv4/kernels/_ptx_text.py) run instruction by instruction on the CPU
(tests/ptx_model.py): every byte value in every position of a word, with scale bytes across the documented
exact range, gives each byte's two e2m1 nibbles times scale * 2^-8 as a bf16 pair, in element order."""

from __future__ import annotations

import numpy as np
import torch

from dsv4.kernels import _ptx_text as P
from dsv4.ops import quantize as Q
from ptx_model import run_ptx


def _bf16(half: int) -> float:
    return float(np.array([half << 16], dtype=np.uint32).view(np.float32)[0])


def test_scale_byte_to_factor_pair():
    for b in range(10, 137):
        f = run_ptx(P.E8M0_BF16X2, {"$1": b})["$0"]
        assert f & 0xFFFF == f >> 16, b
        assert _bf16(f & 0xFFFF) == 2.0 ** (b - 9), b


def test_decode_is_exact_for_every_byte_and_scale():
    e2m1 = Q._e2m1_values(torch.arange(16, dtype=torch.uint8)).double().numpy()
    rng = np.random.default_rng(int(torch.randint(2**31, ())))
    for b in range(256):
        for pos in range(4):
            word = int(rng.integers(0, 2**32)) & ~(0xFF << (8 * pos)) | (b << (8 * pos))
            sb = int(rng.integers(10, 137))  # UE8M0 scale byte
            f = run_ptx(P.E8M0_BF16X2, {"$1": sb})["$0"]
            regs = run_ptx(P.E2M1X8_BF16X2, {"$4": word, "$5": f})
            for p in range(4):  # byte p -> register $p: (element 2p, element 2p + 1) = (low, high nibble)
                byte = (word >> (8 * p)) & 0xFF
                for half, code in ((regs[f"${p}"] & 0xFFFF, byte & 0xF), (regs[f"${p}"] >> 16, byte >> 4)):
                    want = e2m1[code] * 2.0 ** (sb - 127) / P.FOLD
                    assert _bf16(half) == want, (hex(word), p, code, sb)
