"""Planted host-sync hazards (and a graph-safe twin): device->host reads and waits.

Every hazard line carries a `# HAZARD: <category>` marker; the tests find lines by marker.
Inputs live in static buffers refilled with copy_ in prepare(), so only the planted hazards show.
"""

import torch


class HostSync:
    def __init__(self, device):
        self.x = torch.zeros(16, device=device)
        self.mask = torch.zeros(16, dtype=torch.bool, device=device)
        self.counts = torch.zeros(16, dtype=torch.long, device=device)

    def prepare(self, i):
        self.x.copy_(torch.randn(16))
        m = torch.zeros(16, dtype=torch.bool)
        m[torch.randperm(16)[:4]] = True  # always 4 True: shapes stay static, only the sync is planted
        self.mask.copy_(m)
        self.counts.copy_(torch.randint(0, 4, (16,)))

    def step(self):
        x = self.x
        total = x.sum().item()  # HAZARD: host-sync
        first = x[:4].tolist()  # HAZARD: host-sync
        if (x.abs() + 1).min() > 0:  # HAZARD: host-sync
            x = x * 2
        idx = torch.nonzero(self.mask)  # HAZARD: host-sync
        host = x.cpu()  # HAZARD: host-sync
        k = int(x.abs().argmax())  # HAZARD: host-sync
        picked = x[self.mask]  # HAZARD: host-sync
        arr = x.numpy(force=True)  # HAZARD: host-sync
        scale = float(x.abs().max())  # HAZARD: host-sync
        hist = torch.bincount(self.counts, minlength=4)  # HAZARD: host-sync
        if x.is_cuda:  # a CPU scan never takes this branch: found in the source
            torch.cuda.current_stream().synchronize()  # HAZARD: host-sync
        del total, first, host, k, arr, scale
        return x + idx.sum() + picked.sum() + hist.sum()


class HostSyncClean:
    """The same computation without leaving the device."""

    def __init__(self, device):
        self.x = torch.zeros(16, device=device)
        self.mask = torch.zeros(16, dtype=torch.bool, device=device)
        self.counts = torch.zeros(16, dtype=torch.long, device=device)
        self.hist = torch.zeros(4, dtype=torch.long, device=device)
        self.ones = torch.ones(16, dtype=torch.long, device=device)

    prepare = HostSync.prepare

    def step(self):
        x = self.x
        x = torch.where((x.abs() + 1).min() > 0, x * 2, x)
        idx_sum = (self.mask.long() * torch.arange(16, device=x.device)).sum()
        picked = torch.where(self.mask, x, 0.0)
        self.hist.zero_().scatter_add_(0, self.counts, self.ones)
        if x.is_cuda:  # device-guarded code without a wait: nothing to report
            x = x.contiguous()
        return x + idx_sum + picked.sum() + self.hist.sum()


def make(device):
    return HostSync(device)


def make_clean(device):
    return HostSyncClean(device)
