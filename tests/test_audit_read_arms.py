"""Tests a read value never reaches, and tests of its type: no branch on data.

sentence-transformers' `quantize_embeddings` starts `if isinstance(e, Tensor): e = e.cpu().numpy()` and goes on
`elif isinstance(e, list): ... if not e:`: the `elif` arm runs only on a pass that skipped the read, so its tests
never see the value read back; and `isinstance(v, list)` after `v = t.tolist()` reads the type the tensor's shape
fixes, not its data. Inside a loop the other arm does see the value of an earlier pass: still a branch.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, marked_line, matmul_target, table, write_target

NOT_FOUND = {
    "elif of the reading if": """        v = torch.tanh(self.x @ self.w)
        if isinstance(v, torch.Tensor):
            v = v.cpu().numpy()
        elif not v:
            self.out.mul_(0.5)
        elif v[0] > {big}:
            self.out.mul_(0.25)""",
    "else of the reading if": """        v = torch.tanh(self.x @ self.w)
        if self.flag:
            v = float(v.abs().sum())
        else:
            v = 0.0 if v is None else {big}
            if v > {big} * 2:
                self.out.mul_(0.5)""",
    "type test": """        ids = (self.x @ self.w).argmax(-1).tolist()
        if isinstance(ids, list):
            self.out.mul_(1.0)
        if type(ids) is int:
            self.out.mul_(0.5)""",
}
FOUND = {
    "elif in a loop": """        v = torch.tanh(self.x @ self.w)
        for _ in range(2):
            if isinstance(v, torch.Tensor):
                v = float(v.abs().sum())
            elif v > {big}:  # BRANCH
                self.out.mul_(0.5)""",
    "after the if": """        v = torch.tanh(self.x @ self.w)
        if isinstance(v, torch.Tensor):
            v = float(v.abs().sum())
        if v > {big}:  # BRANCH
            self.out.mul_(0.5)""",
}


def _scan(tmp_path, body: str):
    tpl = matmul_target(init="        self.flag = True", step=f"""        self.out.copy_(torch.tanh(self.x @ self.w))
{body.format(big=random.randrange(10**9, 10**10))}
        return self.out""")
    path, _ = write_target(tmp_path / "read_arm.py", tpl, marker="def step", seed=random.randrange(2**31),
                           d=random.choice([4, 8, 16]))
    return blocking(path), path


@pytest.mark.parametrize("kind", sorted(NOT_FOUND))
def test_a_test_the_read_never_reaches_or_a_type_test_is_no_branch(tmp_path, kind):
    bad, _ = _scan(tmp_path, NOT_FOUND[kind])
    assert not len(bad[bad.category == "data-dependent-control"]), table(bad)
    assert len(bad[bad.category == "host-sync"]) >= 1, table(bad)


@pytest.mark.parametrize("kind", sorted(FOUND))
def test_a_test_the_read_reaches_is_still_a_branch(tmp_path, kind):
    bad, path = _scan(tmp_path, FOUND[kind])
    hit = bad[(bad.category == "data-dependent-control") & (bad.line == marked_line(path, "# BRANCH"))]
    assert len(hit) == 1, table(bad)
