"""A mixture of experts: a Python loop over the experts hit (the hazard) and a dense masked one."""

import torch


def routed(x, weights, scores, k: int = 2):
    top = scores.topk(k).indices
    hit = torch.zeros(weights.shape[0], dtype=torch.bool, device=x.device).index_fill_(0, top, True)
    out = torch.zeros_like(x)
    for e in hit.nonzero().flatten().tolist():  # HAZARD: host-sync
        out = out + x @ weights[e]  # HAZARD: baked-host-value
    return out


def dense(x, weights, scores, k: int = 2):
    top = scores.topk(k).indices
    gate = torch.zeros(weights.shape[0], device=x.device).index_fill_(0, top, 1.0)
    return torch.einsum("e,d,edf->f", gate, x, weights)
