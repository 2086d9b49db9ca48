"""Some torch ops always make an output in host memory, whatever the device of their inputs:
`PackedSequence.batch_sizes` is a CPU tensor on a GPU too. The RNN over a packed sequence reads it back
(`int(batch_sizes[0])`), which waits for nothing; a CPU scan, where every tensor is a host tensor, must
not call that a host-sync. A read of the packed data itself still is one.
"""

from __future__ import annotations

import random

from site_util import at, blocking, marked_line, table, write_target

TARGET = """
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

class Target:
    def __init__(self, device):
        torch.manual_seed({seed})
        self.gru = nn.GRU({d}, {d}, batch_first=True).to(device)
        self.lengths = torch.tensor({lengths}, dtype=torch.long, device="cpu")
        self.x = torch.zeros({b}, {t}, {d}, device=device)
        self.out = torch.zeros({b}, {d}, device=device)

    def prepare(self, i):
        self.x.copy_(torch.randn({b}, {t}, {d}))

    @torch.no_grad()
    def step(self):
        packed = pack_padded_sequence(self.x, self.lengths, batch_first=True, enforce_sorted=True)
        y, _ = self.gru(packed)  # SITE
        y, _ = pad_packed_sequence(y, batch_first=True, total_length={t})
        {extra}
        self.out.copy_(y[:, 0])
        return self.out

def make(device):
    return Target(device)
"""


def _write(tmp_path, extra: str = "pass"):
    seed, d, b, t = random.randrange(2**31), random.choice([4, 8]), random.choice([2, 3]), random.choice([3, 5])
    lengths = sorted((random.randint(1, t) for _ in range(b)), reverse=True)
    lengths[0] = t
    path, site = write_target(tmp_path / "packed_target.py", TARGET, seed=seed, d=d, b=b, t=t, lengths=lengths,
                              extra=extra)
    return path, site, marked_line(path, "# READ" if "# READ" in extra else extra)


def test_rnn_over_a_packed_sequence_reads_only_host_batch_sizes(tmp_path):
    path, _, _ = _write(tmp_path)
    bad = blocking(path)
    assert bad.empty, table(bad)


def test_reading_the_packed_data_is_still_a_host_sync(tmp_path):
    path, _, read = _write(tmp_path, "if y.sum() > 0: y = y * 2  # READ")
    bad = blocking(path)
    assert not at(bad, "host-sync", read).empty, table(bad)
