"""A person's own decode step around a Hugging Face model: a tiny random Llama built here (nothing is
downloaded), on a DynamicCache (the hazard: the cache grows by torch.cat inside transformers) and on
a StaticCache (the graph-safe twin). Every finding names transformers' own line; the line below
that called the model is marked `# CALLS:` and is each finding's caller.
"""

import inspect

import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, StaticCache

PROMPT = 8
CACHE = "cache" if "cache" in inspect.signature(LlamaForCausalLM.forward).parameters else "past_key_values"


class Decode:
    def __init__(self, device, static: bool = False):
        cfg = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
        torch.manual_seed(0)
        self.model = LlamaForCausalLM(cfg).to(device).eval()
        self.cache = StaticCache(config=cfg, max_cache_len=64) if static else DynamicCache(config=cfg)
        self.ids = torch.zeros(1, 1, dtype=torch.long, device=device)
        with torch.no_grad():
            self.model(input_ids=torch.randint(0, 128, (1, PROMPT), device=device), use_cache=True, **{CACHE: self.cache})

    def prepare(self, i):
        self.ids.copy_(torch.randint(0, 128, (1, 1)))

    @torch.no_grad()
    def step(self):
        return self.model(input_ids=self.ids, use_cache=True, **{CACHE: self.cache}).logits  # CALLS: transformers


def make(device):
    return Decode(device)


def make_clean(device):
    return Decode(device, static=True)
