"""A `for` loop zipping the host's own objects with values read back from the device binds only the name paired
with the read: `for seq, tok in zip(self.seqs, ids.tolist()):` reads `tok`, while `seq` is a host object the read
never touched. A branch on `seq`'s bookkeeping (`if len(seq.toks) % BS == 0:`, a block filling up: a prefix-cache
insert) is no branch on a read value; one on `tok` is. `enumerate` binds its index to no read either."""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, marked_line, matmul_target, table, write_target

INIT = """        self.seqs = [type("Seq", (), {{}})() for _ in range({d})]
        for s in self.seqs:
            s.toks = [0] * {start}
        self.cache = {{}}"""

LOOPS = {
    "zip": "for seq, tok in zip(self.seqs, ids.tolist()):  # READ",
    "enumerate zip": "for b, (seq, tok) in enumerate(zip(self.seqs, ids.tolist())):  # READ",
}
TESTS = {
    "host bookkeeping": ("if len(seq.toks) % {bs} == 0:  # SITE", False),
    "the read value": ("if tok > {big}:  # SITE", True),
}


def _step(loop: str, test: str) -> str:
    return f"""        ids = (self.x @ self.w).argmax(-1).repeat({{d}})[:{{d}}]
        {loop}
            seq.toks.append(tok)
            {test}
                self.cache[(len(seq.toks), tok)] = len(self.cache)
        self.out.copy_(self.x @ self.w)"""


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("kind", TESTS)
def test_only_the_name_paired_with_the_read_is_a_read_value(tmp_path, loop, kind):
    test, found = TESTS[kind]
    template = matmul_target(_step(LOOPS[loop], test), init=INIT)
    path, site = write_target(tmp_path / "paired.py", template, seed=random.randrange(1000),
                              d=random.choice([4, 8]), bs=random.choice([2, 3, 4]), big=random.randrange(10**6, 10**7),
                              start=random.randrange(1, 9))
    bad = blocking(path)
    assert len(at(bad, "host-sync", marked_line(path, "# READ"))) == 1, table(bad)
    assert len(at(bad, "data-dependent-control", site)) == (1 if found else 0), table(bad)
