"""host-sync: reads of a tensor the step already copied to the host are host memory, not more waits.

`ids = logits.argmax(-1).cpu()` waits for the device once, at that line. What the code then reads from `ids`
(`for row in ids: [int(t) for t in row if t != blank]`, `ids.tolist()`) is host memory on a GPU. On a CPU scan
`.cpu()` returns the tensor itself, so only the source tells the copy from the device tensor: a read that names
the copy is no finding, while a read of the device tensor it came from (`scores.max().item()`) still is one."""

from __future__ import annotations

import random

from site_util import blocking, install_library, marked_line, module_target, table, write_target

LIB = """
import torch


class Greedy:
    def __init__(self, blank):
        self.blank = blank
        self.hyps = []

    def __call__(self, scores):
        ids = scores.argmax(-1){move}  # COPY
        {reads}
        {device_read}
        return scores.softmax(-1)
"""

READS = ["for b, row in enumerate(ids):\n            self.hyps = [int(t) for t in row if t != self.blank][-4:]",
         "for row in ids:\n            n = sum(1 for t in row if bool(t != self.blank))",
         "toks = ids.tolist()\n        first = int(ids[0, 0])"]


def test_reads_of_the_host_copy_add_no_finding(tmp_path, monkeypatch):
    move = random.choice([".cpu()", '.to("cpu")', ".to(device='cpu')"])
    reads = random.choice(READS)
    device_read = random.choice([True, False])
    extra = "peak = scores.max().item()  # DEVREAD" if device_read else "pass"
    mod, lib = install_library(tmp_path, monkeypatch, LIB.format(move=move, reads=reads, device_read=extra),
                               prefix="hostcopy")
    d = random.choice([4, 8])
    tpl = module_target(imports=f"from {mod} import Greedy",
                        init=f"        self.g = Greedy({random.randint(0, 3)})",
                        step="        y = self.g(self.x.view(1, 1, -1).expand(2, 3, -1) * 1.0)  # SITE\n"
                             "        self.out.copy_(y[0, 0].view(1, -1))")
    path, site = write_target(tmp_path / "target" / "hostcopy.py", tpl, seed=random.randrange(2**31), d=d)
    bad = blocking(path, forget=mod)
    hs = bad[bad.category == "host-sync"]
    want = {marked_line(lib, "# COPY")} | ({marked_line(lib, "# DEVREAD")} if device_read else set())
    assert set(hs.line) == want, table(bad)
