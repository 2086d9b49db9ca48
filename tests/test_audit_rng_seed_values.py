"""A reseed in the step is judged by the seeds the steps passed (CUDAGeneratorImpl::set_current_seed under
capture): one seed every step passes capture as a no-op, so the replay drifts from eager (silent); a seed that
changes between steps, or two different ones, raises during capture (blocking)."""

from __future__ import annotations

import random
import textwrap

import audit

_TARGET = textwrap.dedent('''
    import torch

    SEED, OTHER = {seed}, {other}

    class Step:
        def __init__(self, varying, second):
            self.varying, self.second, self.k = varying, second, 0
            self.probs = torch.rand(2, 8) + 0.1

        def prepare(self, i):
            self.k = i

        def step(self):
            torch.manual_seed(SEED + self.k if self.varying else SEED)  # first seed
            out = torch.multinomial(self.probs, 1)
            if self.second:
                torch.cuda.manual_seed_all(OTHER)  # second seed
            return out

    def make(device):
        return Step(varying={varying}, second={second})
''')


def _scan(tmp_path, varying, second):
    seed, other = random.sample(range(1, 2**31), 2)
    path = tmp_path / "reseed.py"
    path.write_text(_TARGET.format(seed=seed, other=other, varying=varying, second=second))
    inv = audit.scan(f"{path}:make", device="cpu", steps=5)
    rows = inv.df[(inv.df.category == "rng") & inv.df.op.astype(str).str.contains("seed")]
    src = path.read_text().splitlines()
    return seed, {(src[int(r.line) - 1].split("# ")[-1], r.severity, r.message) for r in rows.itertuples()}


def test_the_same_seed_every_step_is_a_silent_replay_drift(tmp_path):
    seed, rows = _scan(tmp_path, varying=False, second=False)
    assert [(line, sev) for line, sev, _ in rows] == [("first seed", "silent-corruption")], rows
    assert f"({seed})" in next(iter(rows))[2]


def test_a_seed_that_changes_between_steps_blocks_capture(tmp_path):
    _, rows = _scan(tmp_path, varying=True, second=False)
    assert [(line, sev) for line, sev, _ in rows] == [("first seed", "blocks-capture")], rows


def test_two_different_constant_seeds_in_one_step_block_capture(tmp_path):
    _, rows = _scan(tmp_path, varying=False, second=True)
    assert sorted((line, sev) for line, sev, _ in rows) == [("first seed", "blocks-capture"),
                                                            ("second seed", "blocks-capture")], rows
