"""Planted draft-head decoding with masked writes and a side-stream prefetch (and a graph-safe twin).

How many draft heads run is read back from the device (a host read, and a loop whose trip count
the data picks); the drafts then fill a slice whose bound varies, full-range on some steps, where
torch runs no slice op at all: no branch chose that, the bound is already the host read's doing.
A bool-mask write of a Python scalar (`probs[mask] = 0.0`) is masked_fill_, no host read; a mask
write of a device value (`= probs.max()`) goes through nonzero() and waits. The next pages are
prefetched on a side stream forked from and joined to torch.cuda.default_stream(), which under
capture is not the step's stream: the copy is left out of the graph.
"""

import torch

D, H, V, P = 16, 4, 32, 4
MIN_P = 0.05


class DraftDecode:
    def __init__(self, device):
        self.heads = torch.randn(H, D, D, device=device) / D**0.5
        self.w = torch.randn(D, V, device=device)
        self.h = torch.zeros(D, device=device)
        self.budget = torch.zeros((), dtype=torch.long, device=device)  # set by the acceptance kernel
        self.drafts = torch.zeros(H, D, device=device)
        self.pool = torch.randn(P, D, device=device)
        self.staged = torch.zeros(P, D, device=device)
        self.side = None
        self.phase = int(torch.randint(0, H, ()))

    def prepare(self, i):
        self.h.copy_(torch.randn(D))
        self.budget.fill_(1 + (i + self.phase) % H)  # all H heads (a full-range slice) one step in H

    @torch.no_grad()
    def step(self):
        self.side = self.side or torch.cuda.Stream()
        main = torch.cuda.default_stream()
        self.side.wait_stream(main)
        with torch.cuda.stream(self.side):  # HAZARD: unjoined-stream
            self.staged.copy_(self.pool * 0.5)
        heads = [self.h @ self.heads[j] for j in range(int(self.budget))]  # HAZARD: host-sync, data-dependent-control
        self.drafts.zero_()
        self.drafts[: len(heads)] = torch.stack(heads)  # HAZARD: dynamic-shape, baked-host-value
        probs = torch.softmax(self.drafts @ self.w, dim=-1)
        probs[probs < MIN_P * probs.amax(-1, keepdim=True)] = 0.0
        probs[probs.isnan()] = probs.max()  # HAZARD: host-sync
        main.wait_stream(self.side)
        return probs.argmax(-1), self.staged.sum(0)


class DraftDecodeClean(DraftDecode):
    """All heads run every step and the budget masks the rows on the device; the mask writes take
    Python scalars, and the prefetch forks from and joins the step's own stream."""

    @torch.no_grad()
    def step(self):
        self.side = self.side or torch.cuda.Stream()
        main = torch.cuda.current_stream()
        self.side.wait_stream(main)
        with torch.cuda.stream(self.side):
            self.staged.copy_(self.pool * 0.5)
        live = torch.arange(H, device=self.h.device) < self.budget
        self.drafts.copy_(torch.einsum("d,hde->he", self.h, self.heads) * live[:, None])
        probs = torch.softmax(self.drafts @ self.w, dim=-1)
        probs[probs < MIN_P * probs.amax(-1, keepdim=True)] = 0.0
        probs[probs.isnan()] = 0.0
        main.wait_stream(self.side)
        return probs.argmax(-1), self.staged.sum(0)


def make(device):
    return DraftDecode(device)


def make_clean(device):
    return DraftDecodeClean(device)
