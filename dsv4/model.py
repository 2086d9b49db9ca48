"""The DeepSeek-V4 transformer: embed -> blocks (mHC around attention and MoE) -> hc_head -> norm -> head.

State-dict keys are the released checkpoint's bare keys. `prefill` starts a new sequence and
fills every layer's cache; `decode` advances it by one token (reference path: Python-int
position, host-side branches; the graph-ready path lives in dsv4/decode/).
"""

from __future__ import annotations


import torch
from torch import nn

from dsv4 import kernels
from dsv4.cache import AttentionCache
from dsv4.config import ModelConfig
from dsv4.errors import DSV4Error
from dsv4.layers.attention import Attention
from dsv4.layers.linear import Linear
from dsv4.layers.mhc import hc_head, hc_post, hc_pre
from dsv4.layers.moe import MoE
from dsv4.layers.norm import RMSNorm


def _hc_params(module: nn.Module, prefix: str, n_mix: int, width: int, n_scale: int, device) -> None:
    """Registers `{prefix}_fn` [n_mix, width], `{prefix}_base` [n_mix], `{prefix}_scale` [n_scale] (fp32)."""
    for name, shape in (("fn", (n_mix, width)), ("base", (n_mix,)), ("scale", (n_scale,))):
        setattr(module, f"{prefix}_{name}", nn.Parameter(torch.zeros(shape, device=device), requires_grad=False))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, device=None):
        super().__init__()
        self.cfg, self.layer_id = cfg, layer_id
        hc = cfg.hc_mult
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps, device)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps, device)
        self.attn = Attention(cfg, layer_id, device)
        self.ffn = MoE(cfg, layer_id, device)
        for site in ("attn", "ffn"):
            _hc_params(self, f"hc_{site}", (2 + hc) * hc, hc * cfg.dim, 3, device)

    @property
    def device(self) -> torch.device:
        return self.attn_norm.weight.device

    def site_pre(self, X: torch.Tensor, site: str):
        c = self.cfg
        return hc_pre(X, getattr(self, f"hc_{site}_fn"), getattr(self, f"hc_{site}_scale"),
                      getattr(self, f"hc_{site}_base"), c.hc_mult, c.hc_sinkhorn_iters, c.norm_eps, c.hc_eps)

    def forward(self, X: torch.Tensor, ids: torch.Tensor, pos: int | None) -> torch.Tensor:
        """X [B,T,hc,d]; pos None = prefill of a new sequence, else the decode position."""
        x, post, comb = self.site_pre(X, "attn")
        x = self.attn_norm(x)
        y = self.attn.prefill(x) if pos is None else self.attn.decode(x, pos)
        X = hc_post(y, X, post, comb)
        x, post, comb = self.site_pre(X, "ffn")
        return hc_post(self.ffn(self.ffn_norm(x), ids), X, post, comb)


def final_collapse(owner: nn.Module, X: torch.Tensor) -> torch.Tensor:
    """hc_head collapse of the streams, then the final RMSNorm (`owner` holds hc_head_* and norm)."""
    c = owner.cfg
    return owner.norm(hc_head(X, owner.hc_head_fn, owner.hc_head_scale, owner.hc_head_base, c.norm_eps, c.hc_eps))


class MTPLayer(Block):
    """mtp.0: one more block that predicts the token after next from the last streams and the next
    token's embedding; it has its own hc_head and norm and shares embed and head with the model."""

    def __init__(self, cfg: ModelConfig, layer_id: int, device=None):
        super().__init__(cfg, layer_id, device)
        self.enorm = RMSNorm(cfg.dim, cfg.norm_eps, device)
        self.hnorm = RMSNorm(cfg.dim, cfg.norm_eps, device)
        self.e_proj = Linear(cfg.dim, cfg.dim, cfg.weight_fmt, cfg, device)
        self.h_proj = Linear(cfg.dim, cfg.dim, cfg.weight_fmt, cfg, device)
        _hc_params(self, "hc_head", cfg.hc_mult, cfg.hc_mult * cfg.dim, 1, device)
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps, device)

    def predict(self, e: torch.Tensor, H: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """e [B,T,d] next-token embeddings, H [B,T,hc,d] last streams -> collapsed hidden [B,T,d]."""
        X = self.e_proj(self.enorm(e)).unsqueeze(-2) + self.h_proj(self.hnorm(H))
        return final_collapse(self, super().forward(X, ids, None))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig, device=None):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim, device=device, dtype=torch.bfloat16)
        self.embed.weight.requires_grad_(False)
        self.layers = nn.ModuleList(Block(cfg, i, device) for i in range(cfg.n_layers))
        _hc_params(self, "hc_head", cfg.hc_mult, cfg.hc_mult * cfg.dim, 1, device)
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps, device)
        self.head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False, device=device, dtype=torch.bfloat16)
        self.head.weight.requires_grad_(False)
        self.mtp = nn.ModuleList(MTPLayer(cfg, cfg.n_layers + i, device) for i in range(cfg.n_mtp_layers))
        self.pos: int | None = None  # next decode position; None before prefill
        self.tp = None  # the tensor-parallel Shard this rank holds (dsv4/decode/parallel.py); None: whole model
        self.cache_generation = 0  # bumped whenever allocate_caches replaces a cache (captured graphs go stale)

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    # ------------------------------------------------------------ forward pieces
    def streams(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids).to(self.cfg.act_dtype)
        return h.unsqueeze(-2).expand(*h.shape[:-1], self.cfg.hc_mult, h.shape[-1]).contiguous()

    def logits(self, X: torch.Tensor) -> torch.Tensor:
        """Streams of the last position [B,hc,d] -> fp32 logits [B,vocab]."""
        X = X.to(self.head.weight.device)
        x = final_collapse(self, X).float()
        y = kernels.bf16_dense_gemv(x, self.head.weight)
        return y if y is not None else x @ self.head.weight.float().t()

    # ------------------------------------------------------------ public API
    @torch.no_grad()
    def prefill(self, tokens: torch.Tensor) -> torch.Tensor:
        """LongTensor[B,T] -> FloatTensor[B,vocab] at the last position; starts a new sequence."""
        tokens = self.check_tokens(tokens, ndim=2)
        B, T = tokens.shape
        if T > self.cfg.max_seq_len:
            raise DSV4Error(f"prompt of {T} tokens is longer than the cache (max_seq_len={self.cfg.max_seq_len})")
        self.allocate_caches(B)
        X = self.streams(tokens)
        for layer in self.layers:
            X = layer(X.to(layer.device), tokens.to(layer.device), None)
        self.pos = T
        return self.logits(X[:, -1])

    @torch.no_grad()
    def decode(self, tokens: torch.Tensor, validate: bool = True) -> torch.Tensor:
        """LongTensor[B] -> FloatTensor[B,vocab] for the next position of the current sequence."""
        if validate:
            tokens = self.check_decode(tokens)
        X = self.streams(tokens[:, None])
        for layer in self.layers:
            X = layer(X.to(layer.device), tokens[:, None].to(layer.device), self.pos)
        self.pos += 1
        return self.logits(X[:, -1])

    def reset(self) -> None:
        self.pos = None
        for layer in self.layers:
            if layer.attn.cache is not None:
                layer.attn.cache.reset()

    # ------------------------------------------------------------ caches and checks
    def allocate_caches(self, batch: int) -> None:
        """(Re)allocates every layer's cache for `batch` sequences and cfg.max_seq_len; reuses matching ones.
        A replacement bumps cache_generation: a CUDA graph captured on the old caches must not replay."""
        for layer in self.layers:
            c = layer.attn.cache
            if c is None or c.batch != batch or c.window.device != layer.device or c.capacity != self.cfg.max_seq_len:
                layer.attn.cache = AttentionCache.allocate(self.cfg, layer.attn.ratio, batch, layer.device)
                self.cache_generation += c is not None

    def cache_tensors(self) -> list[torch.Tensor]:
        """Every decode-state tensor of every layer: windows, compressed entries, compressor states."""
        out = []
        for layer in self.layers:
            c = layer.attn.cache
            if c is None:
                continue
            out += [t for t in (c.window, c.comp, c.index_keys) if t is not None]
            out += [st.both for st in (c.comp_state, c.index_state) if st is not None]  # kv and score
        return out

    @property
    def batch_size(self) -> int | None:
        c = self.layers[0].attn.cache
        return None if c is None or self.pos is None else c.batch

    def check_decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """Host-side checks of a decode call (outside any graph): order, batch, position, ids."""
        if self.pos is None:
            raise DSV4Error("decode before prefill: call prefill(prompt) to start a sequence")
        tokens = self.check_tokens(tokens, ndim=1)
        if tokens.shape[0] != self.batch_size:
            raise DSV4Error(f"batch-size mismatch: decode got {tokens.shape[0]} tokens, the sequence has batch "
                            f"{self.batch_size}")
        if self.pos >= self.cfg.max_seq_len:
            raise DSV4Error(f"cannot decode past max_seq_len={self.cfg.max_seq_len}")
        return tokens

    def check_tokens(self, tokens, ndim: int) -> torch.Tensor:
        if not isinstance(tokens, torch.Tensor):
            tokens = torch.as_tensor(tokens)
        if tokens.dim() != ndim or tokens.dtype not in (torch.int64, torch.int32):
            want = "LongTensor[B, T]" if ndim == 2 else "LongTensor[B]"
            raise DSV4Error(f"expected {want} of token ids, got {tuple(tokens.shape)} {tokens.dtype}")
        if tokens.numel() == 0:
            raise DSV4Error("empty token tensor")
        lo, hi = int(tokens.min()), int(tokens.max())
        if lo < 0 or hi >= self.cfg.vocab_size:
            raise DSV4Error(f"token id {hi if hi >= self.cfg.vocab_size else lo} is outside the vocabulary "
                            f"[0, {self.cfg.vocab_size})")
        return tokens.to(self.device, torch.int64)

