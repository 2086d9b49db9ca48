"""Host data sent to the device before it indexes a device tensor: nano-vllm builds its block table from Python
lists in the step, `torch.tensor(rows, pin_memory=True).to(dev, non_blocking=True)`, then gathers
`k_cache[block_tables]`. On a GPU the gather reads the device copy: the copy is the `.to(D)` line's finding,
and the indexing line copies nothing. The same table used as an index without the `.to(D)` is copied to the
device by the indexing op itself, and stays a finding at the indexing line."""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, marked_line, table, write_target

TARGET = """
import torch

class Paged:
    def __init__(self, device):
        self.device = device
        self.pool = torch.randn({nb}, {bs}, {d}, device=device)
        self.rows = [[0], [1]]

    def prepare(self, i):
        self.rows = [torch.randint(0, {nb}, ({w},)).tolist() for _ in range({b})]

    def step(self):
        table = torch.tensor(self.rows, dtype=torch.int32{pin})  # LIFT
        {send}
        return self.pool[table].sum(1)  # INDEX

def make(device):
    return Paged(device)
"""

SEND = "table = table.to(self.device, non_blocking=True)  # SEND"


def _write(tmp_path, send: bool, pin: bool):
    fields = dict(nb=random.randrange(8, 40), bs=random.choice([2, 4, 8]), d=random.choice([4, 8]),
                  w=random.randrange(2, 6), b=random.randrange(2, 5), pin=", pin_memory=True" if pin else "",
                  send=SEND if send else "pass")
    path, index = write_target(tmp_path / "sent_index.py", TARGET, marker="# INDEX", **fields)
    return path, index


@pytest.mark.parametrize("pin", [False, True])
def test_a_table_sent_to_the_device_before_it_indexes_is_no_copy_at_the_index(tmp_path, pin):
    path, index = _write(tmp_path, send=True, pin=pin)
    bad = blocking(path)
    assert at(bad, "pageable-copy", index).empty, table(bad)
    assert len(at(bad, "pageable-copy", marked_line(path, "# SEND"))) == 1, table(bad)


def test_a_table_that_indexes_as_host_data_is_copied_at_the_index(tmp_path):
    path, index = _write(tmp_path, send=False, pin=False)
    bad = blocking(path)
    assert len(at(bad, "pageable-copy", index)) == 1, table(bad)
