"""A tiny random Llama from transformers, decoded one token per step on a DynamicCache.

Nothing is downloaded: the config is built here and the weights are seeded random ones. The
hazards live in transformers' own files; each finding names that line and the line of step()
below that led there. Scan it with:
    dsv4-audit scan --target docs/examples/hf_llama_step.py:make --device cpu --out /tmp/hf-llama
"""

import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM


class Target:
    def __init__(self, device):
        torch.manual_seed(0)
        cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, vocab_size=256, max_position_embeddings=128)
        self.model = LlamaForCausalLM(cfg).to(device).eval()
        self.device = device
        self.cache = DynamicCache()
        prompt = torch.randint(0, 256, (1, 8), device=device)
        with torch.no_grad():
            out = self.model(input_ids=prompt, cache=self.cache, use_cache=True)
        self.next_id = out.logits[:, -1:].argmax(-1)
        self.pos = torch.tensor([8], device=device)

    def prepare(self, i):
        self.pos.fill_(8 + i)  # static buffer, refilled in place

    @torch.no_grad()
    def step(self):
        out = self.model(input_ids=self.next_id, cache=self.cache, cache_position=self.pos,
                         use_cache=True)
        self.next_id.copy_(out.logits[:, -1:].argmax(-1))
        return out.logits


def make(device):
    return Target(device)
