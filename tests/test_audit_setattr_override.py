"""A module class with its own `__setattr__` that forwards to nn.Module's (torchmetrics' Metric guards its
constants that way): a counter the step bumps through it is reported at the `+= 1`, not inside the override;
a counter the override bumps itself is reported inside it, at its own line."""

from __future__ import annotations

import random
import textwrap

import audit


def _target(tmp_path, counter: str, dirty: str):
    lib = textwrap.dedent(f"""
        import torch
        from torch import nn


        class Guarded(nn.Module):
            def __init__(self):
                super().__init__()
                self.{counter} = 0
                self.{dirty} = 0
                self.register_buffer("total", torch.zeros(()))

            def __setattr__(self, name, value):
                if name == "frozen":
                    raise RuntimeError("constant")
                if name == "last":
                    self.{dirty} += 1  # BUMPED INSIDE
                super().__setattr__(name, value)

            def update(self, x):
                self.{counter} += 1  # BUMPED
                self.total.add_(x.sum())
                self.last = None
        """)
    src = textwrap.dedent("""
        import torch
        from guardlib import Guarded


        class Step:
            def __init__(self, device):
                self.m = Guarded().to(device)
                self.x = torch.randn(4, 8, device=device)

            def prepare(self, i):
                self.x.normal_()

            def step(self):
                self.m.update(self.x)  # CALL
                return self.m.total * 1.0


        def make(device):
            return Step(device)
        """)
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "guardlib.py").write_text(lib)  # an installed library: not the target's own files
    (tmp_path / "target").mkdir()
    path = tmp_path / "target" / "guarded_target.py"
    path.write_text(src)
    lines = {tag: i for text in (lib, src) for i, t in enumerate(text.splitlines(), 1)
             for tag in ("BUMPED INSIDE", "BUMPED", "CALL") if t.endswith(f"# {tag}")}
    return path, lines


def test_a_counter_bumped_through_a_forwarding_setattr_is_reported_where_it_is_bumped(tmp_path, monkeypatch):
    counter, dirty = random.sample(["_update_count", "calls", "n_updates", "_steps", "seen"], 2)
    path, lines = _target(tmp_path, counter, dirty + "_dirty")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    inv = audit.scan(f"{path}:make", device="cpu", steps=4)
    rows = inv.df[inv.df.category == "cpu-side-effect"]
    assert set(rows.file.astype(str)) == {"guardlib.py"}, rows[["file", "line"]].to_string()
    got = {(int(r.line), int(r.caller_line)) for r in rows.itertuples()}
    assert got == {(lines["BUMPED"], lines["CALL"]), (lines["BUMPED INSIDE"], lines["CALL"])}, \
        rows[["line", "caller_line", "message"]].to_string()
    msg = dict(zip(rows.line.astype(int), rows.message))
    assert counter in msg[lines["BUMPED"]] and dirty in msg[lines["BUMPED INSIDE"]]
