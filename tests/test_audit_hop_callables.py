"""Python functions handed to a higher-order operator in the step: flex_attention's score_mod and mask_mod.

Eagerly, flex_attention runs its own inner ops out of the tracer's sight, but the score_mod and the mask_mod
(the last member of its block-mask tuple) are the user's code: on a GPU they are compiled into the kernel, and
a Python value they close over is baked in as a constant. A softcap kept as a Python float that changes per
step, or a mask bound read from a Python int, is a baked-host-value at the function's line, with the target's
call as caller. The same functions closing over a device tensor filled in place read nothing baked, and what
flex_attention hands them (its score matrix, its index aranges) is made in the step, not a rebound input.
"""

from __future__ import annotations

import pytest

from site_util import clean_or_hit, library_target

LIB = """
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

class Knobs:
    def __init__(self):
        self.cap = 20.0
        self.n = 2
        self.cap_t = torch.full((), 20.0)
        self.n_t = torch.full((), 2)

KNOBS = Knobs()

def _mask_py(b, h, q, kv):
    return kv < KNOBS.n  # LIBSITE mask

def _mask_t(b, h, q, kv):
    return kv < KNOBS.n_t

MASKS = {"py": create_block_mask(_mask_py, 1, 1, 1, 8, device="cpu", BLOCK_SIZE=8),
         "tensor": create_block_mask(_mask_t, 1, 1, 1, 8, device="cpu", BLOCK_SIZE=8)}

def set_knobs(step):
    KNOBS.cap, KNOBS.n = 20.0 + step, 2 + step % 5
    KNOBS.cap_t.fill_(20.0 + step)
    KNOBS.n_t.fill_(2 + step % 5)

def attend(x, kv, how):
    cap, cap_t = KNOBS.cap, KNOBS.cap_t

    def softcap_py(score, b, h, q, k):
        return cap * torch.tanh(score / cap)  # LIBSITE score

    def softcap_t(score, b, h, q, k):
        return cap_t * torch.tanh(score / cap_t)

    q = x.view(1, 1, 1, -1)
    k = kv.view(1, 1, 8, -1)
    if how == "score":
        o = flex_attention(q, k, k, score_mod=softcap_py)
    elif how == "mask":
        o = flex_attention(q, k, k, block_mask=MASKS["py"])
    else:
        o = flex_attention(q, k, k, score_mod=softcap_t, block_mask=MASKS["tensor"])
    return o.view(1, -1)
"""


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("how", ["score", "mask", "clean"])
def test_a_flex_attention_function_closing_over_a_changing_python_value_is_baked(tmp_path, monkeypatch, how):
    mod, lib, path, site = library_target(
        tmp_path, monkeypatch, LIB, "flexmods", "attend, set_knobs", f'attend(self.x, self.kv, "{how}")',
        init="        self.kv = torch.randn(8, self.w.shape[0], generator=g)", prepare="        set_knobs(i)")
    import sys

    import audit
    try:
        bad = audit.scan(f"{path}:make", device="cpu", steps=4).blocking()
    finally:
        sys.modules.pop(mod, None)
    clean_or_hit(bad, how, "baked-host-value", lib, path, site, marker=f"# LIBSITE {how}")
