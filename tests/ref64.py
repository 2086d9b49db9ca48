"""An independent float64 restatement of the DeepSeek-V4 forward pass, for the tests only.

Written from docs/model.md, not from dsv4/: explicit loops and formulas, float64
throughout, and no dsv4 helper is called (weights are read from a dsv4 module's stored bytes and
dequantized here with a hand-written table). A test that compares dsv4 against this file fails
when either one misreads the design, so a shared helper cannot hide a shared bug.
All functions work on ONE sequence (no batch dim) unless stated.
"""

from __future__ import annotations

import math

import torch

D64 = torch.float64


def rel(a, b) -> float:
    """Relative error |a - b| / |b| (Frobenius), in float64."""
    a, b = torch.as_tensor(a).double(), torch.as_tensor(b).double()
    return float((a - b).norm() / b.norm().clamp(min=1e-300))
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]  # codes 0..7; 8..15 are the negatives


# ------------------------------------------------------------------ weights and number formats
def weight64(lin) -> torch.Tensor:
    """A dsv4 Linear's [out, in] weight in float64, dequantized from its stored format."""
    out_f, in_f = lin.out_features, lin.in_features
    if lin.fmt == "bf16":
        return lin.weight.to(D64)
    scale = lin.scale.float().to(D64)
    if lin.fmt == "fp8":  # one power-of-two scale per 128x128 block
        s = scale.repeat_interleave(128, 0)[:out_f].repeat_interleave(128, 1)[:, :in_f]
        return lin.weight.to(D64) * s
    assert lin.fmt == "fp4", lin.fmt
    u = lin.weight.view(torch.uint8).long()
    codes = torch.stack((u & 15, u >> 4), dim=-1).flatten(-2)  # low nibble = even element
    table = torch.tensor(E2M1 + [-v for v in E2M1], dtype=D64)
    return table[codes] * scale.repeat_interleave(32, 1)


def pow2_scale(amax: float, qmax: float, floor: float) -> float:
    """UE8M0 scale rule: 2^ceil(log2(max(amax, floor) / qmax))."""
    return 2.0 ** math.ceil(math.log2(max(amax, floor) / qmax))


def fp8_round64(x: torch.Tensor, block: int) -> torch.Tensor:
    """e4m3 rounding with a power-of-two scale per `block` along the last dim (loops over blocks)."""
    flat = x.to(D64).reshape(-1, x.shape[-1]).clone()
    for r in range(flat.shape[0]):
        for b0 in range(0, flat.shape[1], block):
            seg = flat[r, b0:b0 + block]
            s = pow2_scale(seg.abs().max().item(), 448.0, 1e-4)
            flat[r, b0:b0 + block] = (seg / s).clamp(-448, 448).to(torch.float8_e4m3fn).to(D64) * s
    return flat.view(x.shape)


def representable_fp8_blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    """Per `block` of the last dim: True iff every value is an e4m3 number times the block's scale."""
    xb = x.to(D64).unflatten(-1, (-1, block))
    amax = xb.abs().amax(-1, keepdim=True).clamp(min=1e-4)
    s = torch.exp2(torch.ceil(torch.log2(amax / 448.0)))
    y = xb / s
    return (y.to(torch.float8_e4m3fn).to(D64) == y).all(-1)


def representable_fp4_blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    """Per `block`: True iff every value is in {+-e2m1} * 2^k for one k (the block's own scale)."""
    xb = x.to(D64).unflatten(-1, (-1, block))
    amax = xb.abs().amax(-1, keepdim=True).clamp(min=1e-30)
    s = torch.exp2(torch.ceil(torch.log2(amax / 6.0)))
    y = (xb / s).abs()
    grid = torch.tensor(E2M1, dtype=D64)
    return ((y.unsqueeze(-1) - grid).abs().amin(-1) == 0).all(-1)


# ------------------------------------------------------------------ norms, RoPE
def rms64(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def norm64(norm, x: torch.Tensor) -> torch.Tensor:
    return rms64(x, norm.eps) * norm.weight.to(D64)


def yarn_range64(rot_dim: int, theta: float, beta_fast: float, beta_slow: float, orig_len: int) -> tuple[int, int]:
    """Pair index i has wavelength 2*pi*theta^(2i/rot_dim); it turns orig_len / wavelength times over
    the original context. Solve 'turns == beta' for i: low = floor(i(beta_fast)), high = ceil(i(beta_slow))."""
    def pair_for(turns: float) -> float:
        return math.log(orig_len / (2 * math.pi * turns)) / math.log(theta) * rot_dim / 2

    return max(math.floor(pair_for(beta_fast)), 0), min(math.ceil(pair_for(beta_slow)), rot_dim - 1)


def freqs64(cfg, ratio: int) -> list[float]:
    rd = cfg.rope_head_dim
    theta = cfg.compress_rope_theta if ratio else cfg.rope_theta
    out = []
    low, high = yarn_range64(rd, theta, cfg.beta_fast, cfg.beta_slow, cfg.original_seq_len)
    for i in range(rd // 2):
        f = theta ** (-2 * i / rd)
        if ratio:  # YaRN only in layers with a compressor
            ramp = min(max((i - low) / max(high - low, 1e-3), 0.0), 1.0)
            f = f * (1 - ramp) + f / cfg.rope_factor * ramp
        out.append(f)
    return out


def rope64(x: torch.Tensor, pos: torch.Tensor, freqs: list[float], inverse: bool = False) -> torch.Tensor:
    """Rotates interleaved pairs (x[n+2i], x[n+2i+1]) of the last 2*len(freqs) dims by pos*freq_i.
    pos must broadcast against x.shape[:-1]."""
    x = x.to(D64).contiguous()  # (strided dtype casts are very slow on CPU: convert once)
    out = x.clone()
    nope = x.shape[-1] - 2 * len(freqs)
    sign = -1.0 if inverse else 1.0
    for i, f in enumerate(freqs):
        ang = pos.to(D64) * f
        c, s = torch.cos(ang), sign * torch.sin(ang)
        a, b = x[..., nope + 2 * i], x[..., nope + 2 * i + 1]
        out[..., nope + 2 * i] = a * c - b * s
        out[..., nope + 2 * i + 1] = a * s + b * c
    return out


# ------------------------------------------------------------------ mHC
def sinkhorn64(logits: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """[..., n, n]: softmax over the last axis + eps, divide by column sums, then (iters-1) x (rows, columns)."""
    c = torch.exp(logits - logits.amax(-1, keepdim=True))
    c = c / c.sum(-1, keepdim=True) + eps
    n = c.shape[-1]

    def by_columns(c):  # c[j, i] / (sum_j c[j, i] + eps)
        out = c.clone()
        for i in range(n):
            total = sum(c[..., j, i] for j in range(n)) + eps
            for j in range(n):
                out[..., j, i] = c[..., j, i] / total
        return out

    def by_rows(c):  # c[j, i] / (sum_i c[j, i] + eps)
        out = c.clone()
        for j in range(n):
            total = sum(c[..., j, i] for i in range(n)) + eps
            for i in range(n):
                out[..., j, i] = c[..., j, i] / total
        return out

    c = by_columns(c)
    for _ in range(iters - 1):
        c = by_columns(by_rows(c))
    return c


def hc_split64(X: torch.Tensor, fn, scale, base, hc: int, iters: int, norm_eps: float, hc_eps: float):
    """X [..., hc, d] -> pre [..., hc], post [..., hc], comb [..., hc, hc]."""
    flat = X.to(D64).flatten(-2)
    rho = 1 / torch.sqrt((flat * flat).mean(-1, keepdim=True) + norm_eps)
    mixes = (flat @ fn.to(D64).t()) * rho
    sc, bs = scale.to(D64), base.to(D64)
    pre = torch.sigmoid(mixes[..., :hc] * sc[0] + bs[:hc]) + hc_eps
    post = 2 * torch.sigmoid(mixes[..., hc:2 * hc] * sc[1] + bs[hc:2 * hc])
    comb_logits = (mixes[..., 2 * hc:] * sc[2] + bs[2 * hc:]).unflatten(-1, (hc, hc))
    return pre, post, sinkhorn64(comb_logits, iters, hc_eps)


def collapse64(X: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    X = X.to(D64).contiguous()
    return sum(pre[..., k, None] * X[..., k, :] for k in range(X.shape[-2]))


def hc_post64(y: torch.Tensor, X: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """X'[i] = post[i] * y + sum_j comb[j, i] * X[j]."""
    hc, X, y = X.shape[-2], X.to(D64).contiguous(), y.to(D64)
    return torch.stack([post[..., i, None] * y
                        + sum(comb[..., j, i, None] * X[..., j, :] for j in range(hc))
                        for i in range(hc)], dim=-2)


def hc_head64(X: torch.Tensor, fn, scale, base, norm_eps: float, hc_eps: float) -> torch.Tensor:
    flat = X.to(D64).flatten(-2)
    rho = 1 / torch.sqrt((flat * flat).mean(-1, keepdim=True) + norm_eps)
    pre = torch.sigmoid((flat @ fn.to(D64).t()) * rho * scale.to(D64)[0] + base.to(D64)) + hc_eps
    return collapse64(X, pre)


# ------------------------------------------------------------------ compressor, indexer
def compressor64(comp, x: torch.Tensor, freqs: list[float]) -> torch.Tensor:
    """x [T, d] -> [T // m, width] entries (pooled, RMSNorm, RoPE at j*m)."""
    m, hd, T = comp.ratio, comp.width, x.shape[0]
    kv = x.to(D64) @ weight64(comp.wkv).t()
    z = x.to(D64) @ weight64(comp.wgate).t() + comp.ape.to(D64)[torch.arange(T) % m]
    entries = []
    for j in range(T // m):
        rows = range(j * m, (j + 1) * m)
        if comp.ratio == 4:  # previous block through channels [0, hd), this block through [hd, 2hd)
            k_rows = [kv[t, :hd] if j else torch.zeros(hd, dtype=D64) for t in range((j - 1) * m, j * m)]
            z_rows = [z[t, :hd] if j else torch.full((hd,), -math.inf, dtype=D64) for t in range((j - 1) * m, j * m)]
            k_rows += [kv[t, hd:] for t in rows]
            z_rows += [z[t, hd:] for t in rows]
        else:
            k_rows, z_rows = [kv[t] for t in rows], [z[t] for t in rows]
        K, Z = torch.stack(k_rows), torch.stack(z_rows)
        w = torch.exp(Z - Z.amax(0))
        c = (w / w.sum(0) * K).sum(0)
        entries.append(rope64(norm64(comp.norm, c), torch.tensor(j * m), freqs))
    return torch.stack(entries) if entries else torch.zeros(0, hd, dtype=D64)


def index_scores64(ind, x: torch.Tensor, qr: torch.Tensor, freqs: list[float]) -> torch.Tensor:
    """[T, T//4] indexer scores sum_h w_h ReLU(q_h . k_j) (visibility not applied)."""
    T = x.shape[0]
    keys = compressor64(ind.compressor, x, freqs)
    q = (qr @ weight64(ind.wq_b).t()).view(T, ind.n_heads, ind.head_dim)
    q = rope64(q, torch.arange(T)[:, None], freqs)
    w = (x.to(D64) @ weight64(ind.weights_proj).t()) * ind.head_dim ** -0.5 * ind.n_heads ** -0.5
    return torch.einsum("th,thj->tj", w, torch.relu(torch.einsum("thd,jd->thj", q, keys)))


# ------------------------------------------------------------------ attention
def sink_attention64(q: torch.Tensor, keys: torch.Tensor, sink: torch.Tensor, scale: float) -> torch.Tensor:
    """One query q [H, D] over its selected keys [n, D] (K = V): exp(sink_h) joins the denominator."""
    out = torch.zeros(q.shape, dtype=D64)
    for h in range(q.shape[0]):
        logits = [float(q[h].to(D64) @ keys[i].to(D64)) * scale for i in range(keys.shape[0])]
        top = max(logits + [float(sink[h])])
        e = [math.exp(v - top) for v in logits]
        den = sum(e) + math.exp(float(sink[h]) - top)
        for i in range(keys.shape[0]):
            out[h] += e[i] / den * keys[i].to(D64)
    return out


def grouped_output64(attn, o: torch.Tensor) -> torch.Tensor:
    """o [..., H, D] (already inverse-roped) -> [..., d] through block-diagonal wo_a per group, then wo_b."""
    G = attn.groups
    flat, wa = o.to(D64).flatten(-2), weight64(attn.wo_a)
    width, rank = flat.shape[-1] // G, wa.shape[0] // G
    parts = [flat[..., g * width:(g + 1) * width] @ wa[g * rank:(g + 1) * rank].t() for g in range(G)]
    return torch.cat(parts, dim=-1) @ weight64(attn.wo_b).t()


def attention64(attn, x: torch.Tensor, cfg) -> torch.Tensor:
    """One sequence's prefill through an attention layer: x [T, d] -> [T, d]."""
    T, H, D, W, m = x.shape[0], attn.n_heads, attn.head_dim, cfg.window_size, attn.ratio
    freqs, t = freqs64(cfg, m), torch.arange(T)
    x = x.to(D64)
    qr = norm64(attn.q_norm, x @ weight64(attn.wq_a).t())
    q = rms64((qr @ weight64(attn.wq_b).t()).view(T, H, D), cfg.norm_eps)
    q = rope64(q, t[:, None], freqs)
    kv = rope64(norm64(attn.kv_norm, x @ weight64(attn.wkv).t()), t, freqs)
    comp = compressor64(attn.compressor, x, freqs) if m else None
    scores = index_scores64(attn.indexer, x, qr, freqs) if m == 4 else None
    o = torch.zeros(T, H, D, dtype=D64)
    for i in range(T):
        sel = [kv[max(0, i - W + 1):i + 1]]
        visible = (i + 1) // m if m else 0  # block j is visible iff j < (i+1)//m
        if m == 128:
            sel.append(comp[:visible])
        elif m == 4 and visible:
            k = min(cfg.index_topk, visible)
            sel.append(comp[scores[i, :visible].topk(k).indices])
        o[i] = sink_attention64(q[i], torch.cat(sel), attn.attn_sink, D ** -0.5)
    return grouped_output64(attn, rope64(o, t[:, None], freqs, inverse=True))


# ------------------------------------------------------------------ MoE
def expert64(exp, x: torch.Tensor, weight: torch.Tensor, limit: float) -> torch.Tensor:
    """SwiGLU rows x [n, d] with per-row routing weights [n]: clamp u to +-limit, gate to <= limit,
    and the routing weight multiplies the activation BEFORE w2."""
    g, u = x.to(D64) @ weight64(exp.w1).t(), x.to(D64) @ weight64(exp.w3).t()
    u, g = u.clamp(-limit, limit), g.clamp(max=limit)
    return (g * torch.sigmoid(g) * u * weight.to(D64)[:, None]) @ weight64(exp.w2).t()


def route64(gate, x: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [N, d] -> weights [N, k], experts [N, k]."""
    s = torch.sqrt(torch.log1p(torch.exp(x.to(D64) @ gate.weight.to(D64).t())))
    if gate.hash:
        idx = gate.tid2eid[ids]
    else:
        idx = (s + gate.bias.to(D64)).topk(gate.topk, dim=-1).indices
    w = s.gather(-1, idx)
    return w / w.sum(-1, keepdim=True) * gate.route_scale, idx


def moe64(moe, x: torch.Tensor, ids: torch.Tensor, limit: float) -> torch.Tensor:
    weights, idx = route64(moe.gate, x, ids)
    out = expert64(moe.shared_experts, x, torch.ones(x.shape[0]), limit)
    for e in range(len(moe.experts)):
        rows, slot = (idx == e).nonzero(as_tuple=True)
        if len(rows):
            out[rows] += expert64(moe.experts[e], x[rows], weights[rows, slot], limit)
    return out


# ------------------------------------------------------------------ whole model
def model_logits64(model, ids: torch.Tensor) -> torch.Tensor:
    """ids [T] -> float64 logits [vocab] of the last position (prefill of one sequence)."""
    cfg = model.cfg
    h = model.embed.weight.to(D64)[ids]
    X = torch.stack([h] * cfg.hc_mult, dim=-2)
    for blk in model.layers:
        for site in ("attn", "ffn"):
            pre, post, comb = hc_split64(X, getattr(blk, f"hc_{site}_fn"), getattr(blk, f"hc_{site}_scale"),
                                         getattr(blk, f"hc_{site}_base"), cfg.hc_mult, cfg.hc_sinkhorn_iters,
                                         cfg.norm_eps, cfg.hc_eps)
            x = collapse64(X, pre)
            if site == "attn":
                y = attention64(blk.attn, norm64(blk.attn_norm, x), cfg)
            else:
                y = moe64(blk.ffn, norm64(blk.ffn_norm, x), ids, cfg.swiglu_limit)
            X = hc_post64(y, X, post, comb)
    h = norm64(model.norm, hc_head64(X, model.hc_head_fn, model.hc_head_scale, model.hc_head_base,
                                     cfg.norm_eps, cfg.hc_eps))
    return h[-1] @ model.head.weight.to(D64).t()
