"""Guard: a transformers StaticCache is graph-ready except where its sliding-window layers keep a host counter.

StaticLayer advances a device counter in place, so a full-attention static decode has no blocking finding.
StaticSlidingWindowLayer also advances a Python int (`cumulative_length_int`) that the mask builder reads as the
query offset: a replay would neither advance it nor rebuild the mask, so the scan must name both the mutation
(cpu-side-effect) and the baked offset (baked-host-value) at the target line that called the model.
"""
from __future__ import annotations

import textwrap

import pytest

pytest.importorskip("transformers")

import audit  # noqa: E402

BLOCKING = ("blocks-capture", "silent-corruption")

TARGET = textwrap.dedent('''
    import torch
    from transformers import MistralConfig, MistralForCausalLM, StaticCache


    class Step:
        def __init__(self, device):
            cfg = MistralConfig(hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1,
                                num_hidden_layers=1, vocab_size=64, max_position_embeddings=128, sliding_window=WINDOW)
            self.model = MistralForCausalLM(cfg).to(device).eval()
            self.cache = StaticCache(config=cfg, max_cache_len=48)
            with torch.no_grad():
                self.model(input_ids=torch.randint(0, 64, (1, 5), device=device), past_key_values=self.cache,
                           position_ids=torch.arange(5, device=device)[None], use_cache=True)
            self.ids = torch.zeros(1, 1, dtype=torch.long, device=device)
            self.pos = torch.zeros(1, 1, dtype=torch.long, device=device)
            self.next = torch.zeros(1, 1, dtype=torch.long, device=device)

        def prepare(self, i):
            self.ids.copy_(torch.randint(0, 64, (1, 1)))
            self.pos.fill_(5 + i)

        @torch.no_grad()
        def step(self):
            out = self.model(input_ids=self.ids, past_key_values=self.cache, position_ids=self.pos, use_cache=True)
            torch.argmax(out.logits[:, -1:], dim=-1, out=self.next)


    def make(device="cpu"):
        return Step(device)
''')
CALL = next(n for n, t in enumerate(TARGET.splitlines(), 1) if "out = self.model(" in t)


def _blocking(tmp_path, window):
    f = tmp_path / f"mistral_{window}.py"
    f.write_text(TARGET.replace("WINDOW", str(window)))
    inv = audit.scan(f"{f}:make", device="cpu", steps=3)
    got = set()
    for x in inv.findings():
        if x["severity"] not in BLOCKING:
            continue
        line = x["line"] if str(x["file"]).endswith(f.name) else x.get("caller_line")
        got.add((line, x["category"]))
    return got


def test_sliding_window_static_cache_names_its_host_counter(tmp_path):
    got = _blocking(tmp_path, 32)
    assert (CALL, "cpu-side-effect") in got
    assert (CALL, "baked-host-value") in got


def test_full_attention_static_cache_is_clean(tmp_path):
    assert _blocking(tmp_path, None) == set()
