"""The graph-ready (`static`) decode path and its driver.

StaticDecoder owns a sequence after `prefill` (which runs the reference prefill, outside any
graph). `stage(ids)` is the host side of a step: checks, then a copy of the ids into a static
device buffer through a pinned staging buffer. `step()` is the region a graph captures: it reads
only static buffers and the preallocated caches, keeps the position on the device and advances
it in place, and returns logits in the same buffer every time. It computes the reference path's
function (tests hold float32 logits to 1e-5 over hundreds of steps).

Each layer is split in three for CUDAGraphDecoder's `ab` mode: `part_a` (mHC pre, norm, q/kv
projections), `part_attn` (cache writes, compressors, indexer, sparse attention), `part_b`
(output projections, mHC post, the FFN site).
"""

from __future__ import annotations

import torch
from torch import nn

from dsv4.decode.static_attention import StaticAttention
from dsv4.decode.static_moe import StaticMoE
from dsv4.errors import DSV4Error
from dsv4.layers.linear import fuse_rows
from dsv4.layers.mhc import hc_post
from dsv4.model import Block, Transformer


class StaticLayer(nn.Module):
    """One Block decoded with device positions; holds the block as a child for module attribution."""

    def __init__(self, block: Block):
        super().__init__()
        self.block = block
        stack_shared_inputs(block)
        self.attention = StaticAttention(block.attn)
        self.moe = StaticMoE(block.ffn)

    def part_a(self, X: torch.Tensor, pos: torch.Tensor):
        x, post, comb = self.block.site_pre(X, "attn")
        x = self.block.attn_norm(x)
        q, kv, qr = self.attention.project(x, pos)
        return x, q, kv, qr, post, comb

    def part_attn(self, x, q, kv, qr, pos) -> torch.Tensor:
        return self.attention.attend(x, q, kv, qr, pos)

    def part_b(self, o, X, post, comb, ids, pos) -> torch.Tensor:
        X = hc_post(self.attention.output(o, pos), X, post, comb)
        x, post, comb = self.block.site_pre(X, "ffn")
        return hc_post(self.moe(self.block.ffn_norm(x), ids), X, post, comb)

    def forward(self, X: torch.Tensor, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        x, q, kv, qr, post, comb = self.part_a(X, pos)
        return self.part_b(self.part_attn(x, q, kv, qr, pos), X, post, comb, ids, pos)


def stack_shared_inputs(block: Block) -> None:
    """Linears that read the same input become one GEMV launch each (dsv4/layers/linear.fuse_rows):
    wq_a | wkv, each compressor's wkv | wgate, the shared expert's w1 | w3."""
    a = block.attn
    fuse_rows(a, ("wq_a", "wkv"))
    for comp in (a.compressor, a.indexer.compressor if a.indexer is not None else None):
        if comp is not None:
            fuse_rows(comp, ("wkv", "wgate"))
    if block.ffn.shared_experts is not None:
        fuse_rows(block.ffn.shared_experts, ("w1", "w3"))


class StaticModel(nn.Module):
    """The whole decode step as one module: ids [B], pos [] -> fp32 logits [B, vocab]."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model
        self.layers = nn.ModuleList(StaticLayer(b) for b in model.layers)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.streams(ids[:, None])

    def head(self, X: torch.Tensor) -> torch.Tensor:
        return self.model.logits(X[:, -1])

    def forward(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        X = self.embed(ids)
        for layer in self.layers:
            dev = layer.block.device
            X = layer(X.to(dev), ids[:, None].to(dev), pos.to(dev))
        return self.head(X)


class StaticDecoder:
    """prefill(tokens) -> stage(ids) -> step() -> logits, with step() free of host work."""

    def __init__(self, model: Transformer, batch_size: int = 1):
        self.model = model
        self.cfg = model.cfg
        self.batch_size = batch_size
        dev = model.device
        self.net = StaticModel(model)
        self.ids = torch.zeros(batch_size, dtype=torch.int64, device=dev)
        self.pos = torch.zeros((), dtype=torch.int64, device=dev)
        pin = dev.type == "cuda"
        self.host_ids = torch.zeros(batch_size, dtype=torch.int64, pin_memory=pin)
        self.host_pos: int | None = None  # host mirror of the position, advanced by stage()
        model.allocate_caches(batch_size)

    @property
    def device(self) -> torch.device:
        return self.ids.device

    @torch.no_grad()
    def prefill(self, tokens: torch.Tensor) -> torch.Tensor:
        tokens = self.model.check_tokens(tokens, ndim=2)
        if tokens.shape[0] != self.batch_size:
            raise DSV4Error(f"batch-size mismatch: prompt has batch {tokens.shape[0]}, decoder was built for "
                            f"{self.batch_size}")
        logits = self.model.prefill(tokens)
        self.pos.fill_(tokens.shape[1])
        self.host_pos = tokens.shape[1]
        return logits

    @torch.no_grad()
    def start_at(self, position: int, generator: torch.Generator | None = None) -> None:
        """A sequence already `position` tokens long, its caches holding random entries: for benchmarks
        at long contexts, where prefilling would cost more than the measurement (the static step's
        work depends on max_seq_len and batch, never on the cached values)."""
        if not 0 < position < self.cfg.max_seq_len:
            raise DSV4Error(f"start position {position} outside (0, max_seq_len={self.cfg.max_seq_len})")
        self.model.allocate_caches(self.batch_size)
        for layer in self.model.layers:
            c = layer.attn.cache
            for t in (c.window, c.comp, c.index_keys):
                if t is not None:
                    t.copy_(torch.randn(t.shape, generator=generator).to(t.dtype))
            for st in (c.comp_state, c.index_state):
                if st is not None:
                    st.reset()
        self.model.pos = position
        self.pos.fill_(position)
        self.host_pos = position

    def stage(self, ids) -> None:
        """Host side of a step: validate, then copy ids into the static input (outside any graph)."""
        if self.host_pos is None:
            raise DSV4Error("decode before prefill: call prefill(prompt) to start a sequence")
        if self.host_pos >= self.cfg.max_seq_len:
            raise DSV4Error(f"cannot decode past max_seq_len={self.cfg.max_seq_len}")
        ids = torch.as_tensor(ids)
        if ids.dim() != 1 or ids.shape[0] != self.batch_size:
            raise DSV4Error(f"batch-size mismatch: expected {self.batch_size} token ids, got shape "
                            f"{tuple(ids.shape)}")
        ids_cpu = ids.to("cpu", torch.int64)
        if bool(((ids_cpu < 0) | (ids_cpu >= self.cfg.vocab_size)).any()):
            raise DSV4Error(f"token id outside the vocabulary [0, {self.cfg.vocab_size})")
        self.host_ids.copy_(ids_cpu)
        self.ids.copy_(self.host_ids, non_blocking=True)
        self.host_pos += 1

    @torch.no_grad()
    def step(self) -> torch.Tensor:
        """The capturable decode step: reads self.ids and self.pos, advances self.pos on the device."""
        logits = self.net(self.ids, self.pos)
        self.pos.add_(1)
        return logits

    def decode(self, ids) -> torch.Tensor:
        self.stage(ids)
        return self.step()
