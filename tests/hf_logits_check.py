"""Last-token logits of a checkpoint through transformers' DeepseekV4ForCausalLM and through dsv4, in float32,
in a fresh interpreter (tests/test_ci_hf_config.py runs it so that no state left by other tests in the worker
touches either model).
    python tests/hf_logits_check.py CKPT TOKEN_SEED   -> one JSON line
"""

from __future__ import annotations

import json
import random
import sys

import torch
from transformers import DeepseekV4ForCausalLM

import dsv4


def main(ckpt: str, seed: int) -> dict:
    torch.manual_seed(seed)
    theirs, info = DeepseekV4ForCausalLM.from_pretrained(ckpt, dtype=torch.float32, local_files_only=True,
                                                         output_loading_info=True)
    ours = dsv4.load(ckpt, device="cpu", dtype="float32")
    T = random.Random(seed).randint(3, 40)  # past the tiny sliding window (16) and the ratio-4 compressor's blocks
    tokens = torch.randint(0, ours.cfg.vocab_size, (1, T))
    with torch.no_grad():
        want = theirs.eval()(tokens).logits[:, -1].float()
        got = ours.prefill(tokens).float()
    return {"loading": {k: sorted(map(str, v)) for k, v in info.items()}, "tokens": tokens.tolist(),
            "err": (got - want).abs().max().item(), "want_max": want.abs().max().item(),
            "nan_theirs": bool(want.isnan().any()), "nan_ours": bool(got.isnan().any())}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]))))
