"""Iterators kept on an object are Python state: `next()` on one in the step is a cpu-side-effect.

Their position is read from `__reduce__`, whose form differs by iterator and by Python version: a list or
tuple iterator carries an index, a range iterator the index before Python 3.12 and the range still ahead from
3.12 on, a dict or set iterator the items left. Each must show a change after `next()` and none without it.
"""

from __future__ import annotations

import random
import textwrap


import audit
from audit.scan.snapshot.fingerprint import fp

KINDS = {
    "range": lambda n: iter(range(n)),
    "list": lambda n: iter(list(range(n))),
    "tuple": lambda n: iter(tuple(range(n))),
    "dict keys": lambda n: iter({f"k{i}": i for i in range(n)}),
    "dict values": lambda n: iter({f"k{i}": i for i in range(n)}.values()),
    "set": lambda n: iter(set(range(n))),
    "zip of ranges": lambda n: zip(range(n), range(1, n + 1)),
    "enumerate of a dict": lambda n: enumerate({i: i for i in range(n)}),
}


def test_each_next_changes_the_fingerprint_and_nothing_else_does():
    for name, make in KINDS.items():
        n = random.randint(8, 40)
        it = make(n)
        for _ in range(random.randint(0, 3)):
            next(it)
        before = fp(it)
        assert fp(it) == before, name  # reading it twice changes nothing
        seen = [before]
        for _ in range(random.randint(2, 5)):
            next(it)
            seen.append(fp(it))
        assert len(set(seen)) == len(seen), (name, seen)


def test_a_dict_iterator_drawn_in_the_step_is_a_side_effect_at_that_line(tmp_path):
    n = random.randint(50, 200)
    src = textwrap.dedent(f"""
        import torch

        class Step:
            def __init__(self, device):
                self.x = torch.randn(4, 8, device=device)
                self.order = iter({{f"layer{{i}}": i for i in range({n})}})

            def prepare(self, i):
                self.x.normal_()

            def step(self):
                name = next(self.order)
                return self.x * 2.0

        def make(device):
            return Step(device)
        """)
    path = tmp_path / "dict_iter_target.py"
    path.write_text(src)
    line = next(i for i, t in enumerate(src.splitlines(), 1) if "next(self.order)" in t)
    inv = audit.scan(f"{path}:make", device="cpu", steps=4)
    rows = inv.df[(inv.df.category == "cpu-side-effect") & inv.df.file.astype(str).str.endswith("dict_iter_target.py")]
    assert set(rows.line.astype(int)) == {line}, inv.df[["category", "line", "message"]].to_string()
    assert "order" in rows.message.iloc[0]
