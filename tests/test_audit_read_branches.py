"""A Python branch on a value the step read back from the device, found in the source even when every
audited step took the same side: `n = int(t.sum())` ... `if n > limit:` (or a name computed from it, a `for`
variable over `t.tolist()`, `range(n)`, a function of the file it is passed to). A test on its own read's line is host-sync's alone; a raising check,
a test on other data or on the read's size alone (`len(ids)`), on an object the value was stored into (`self.last =
n`, then `if self.flag:`), on a list of tensors cut to the read size, and a read skipped while capturing are no such
branch.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, install_library, library_hit, marked_line, matmul_target, table, write_target

# (step body lines, each 8-space indented; `# BRANCH` marks the branch a finding must name). The side taken
# never changes in the audited steps: the threshold is far out of the data's range.
FOUND = {
    "int then if": """        n = int((self.x @ self.w).abs().sum())
        if n > {big}:  # BRANCH
            self.out.mul_(0.5)""",
    "derived name": """        ids = (self.x @ self.w).argmax(-1).tolist()
        word = self.vocab[ids[0] % len(self.vocab)]
        if word in ("<stop_{tag}>", "<end_{tag}>"):  # BRANCH
            self.out.zero_()""",
    "loop variable": """        for v in (self.x @ self.w).abs().amax(-1).tolist():
            if v > {big}:  # BRANCH
                self.out.add_(1.0)""",
    "elif arm": """        m = float((self.x @ self.w).abs().max())
        if self.flag:
            self.out.mul_(1.0)
        elif m > {big}:  # BRANCH
            self.out.mul_(0.5)""",
    "trip count": """        k = int((self.x @ self.w).abs().sum() > -1)
        for _ in range(k):  # BRANCH
            self.out.add_(0.25)""",
    "conditional expression": """        s = (self.x @ self.w).abs().sum().item()
        scale = 0.5 if s > {big} else 1.0  # BRANCH
        self.out.mul_(scale)""",
}
NOT_FOUND = {
    "same line": """        if (self.x @ self.w).abs().sum().item() > {big}:
            self.out.mul_(0.5)""",
    "raising check": """        n = int((self.x @ self.w).abs().sum())
        if n > {big}:
            raise ValueError("overflow")""",
    "size only": """        ids = (self.x @ self.w).argmax(-1).tolist()
        if len(ids) > 1:
            self.out.mul_(0.5)""",
    "stored on self": """        n = int((self.x @ self.w).abs().sum())
        self.last = n
        if self.flag:
            self.out.mul_(0.5)""",
    "cut to a size": """        k = int(((self.x @ self.w) > 0).sum()) % 2 + 1  # 1 or 2, under the width (4 or more): a real cut
        parts = [t[:, :k] for t in (self.out, self.x)]
        if not parts:
            self.out.mul_(0.5)""",
    "other data": """        n = int((self.x @ self.w).abs().sum())
        if self.flag:
            self.out.mul_(0.5)""",
    "read skipped while capturing": """        if not torch.cuda.is_current_stream_capturing():
            n = int((self.x @ self.w).abs().sum())
            if n > {big}:
                self.out.mul_(0.5)""",
}
INIT = """        self.vocab = ["a", "b", "c", "d"]
        self.flag = False"""


# a module function of the target's file the read value is passed to: the branch is in it
HELPER = """
def _scale_for(v, limit):
    if v > limit:  # HELPER BRANCH
        return 0.5
    return 1.0
"""
FOUND["passed to a function"] = """        s = float((self.x @ self.w).abs().sum())
        self.out.mul_(_scale_for(s, limit={big}))"""
NOT_FOUND["function given other data"] = """        s = float((self.x @ self.w).abs().sum())
        self.out.mul_(_scale_for(self.vocab.index("a"), limit={big}))"""


def _scan(tmp_path, body: str):
    step = body.format(big=random.randrange(10**9, 10**10), tag=random.randrange(10**6))
    tpl = matmul_target(init=INIT, imports=HELPER, step=f"""        self.out.copy_(torch.tanh(self.x @ self.w))
{step}
        return self.out""")
    path, _ = write_target(tmp_path / "read_branch.py", tpl, marker="def step", seed=random.randrange(2**31),
                           d=random.choice([4, 8, 16]))
    return blocking(path), path


@pytest.mark.parametrize("kind", sorted(FOUND))
def test_a_branch_on_a_read_value_is_found_at_the_branch(tmp_path, kind):
    bad, path = _scan(tmp_path, FOUND[kind])
    line = marked_line(path, "# HELPER BRANCH" if kind == "passed to a function" else "  # BRANCH")
    hit = bad[(bad.category == "data-dependent-control") & (bad.line == line)]
    assert len(hit) == 1, table(bad)
    assert "read back from the device" in hit.iloc[0].message
    assert len(bad[bad.category == "host-sync"]) >= 1, table(bad)  # the read stays host-sync's


@pytest.mark.parametrize("kind", sorted(NOT_FOUND))
def test_no_branch_on_a_read_value_is_not_reported(tmp_path, kind):
    bad, _ = _scan(tmp_path, NOT_FOUND[kind])
    assert not len(bad[bad.category == "data-dependent-control"]), table(bad)


LIB = """
import torch

def settle(x, w, limit):
    total = float((x @ w).abs().sum())
    if total > limit:  # LIBSITE
        return torch.zeros_like(x @ w)
    return x @ w
"""


def test_a_branch_in_a_library_is_named_with_the_targets_call(tmp_path, monkeypatch):
    mod, lib = install_library(tmp_path, monkeypatch, LIB, prefix="settle")
    tpl = matmul_target(imports=f"from {mod} import settle", step="""        y = settle(self.x, self.w, {limit})  # SITE
        self.out.copy_(y)
        return self.out""")
    path, site = write_target(tmp_path / "target" / "settle_target.py", tpl, seed=random.randrange(2**31),
                              d=random.choice([4, 8, 16]), limit=random.randrange(10**9, 10**10))
    library_hit(blocking(path, forget=mod), "data-dependent-control", lib, path, site)
