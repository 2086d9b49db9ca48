"""Planted targets written from a template: the line marked `# SITE` is where a finding must land."""

from __future__ import annotations

import textwrap
from pathlib import Path


def write_target(path: Path, template: str, marker: str = "# SITE", **fields) -> tuple[Path, int]:
    """The target file from `template` (dedented, `fields` filled in) -> (its path, the marked line's number)."""
    path.write_text(textwrap.dedent(template).format(**fields))
    return path, marked_line(path, marker)


def matmul_target(step: str, imports: str = "", init: str = "", prepare: str = "") -> str:
    """The template of a small planted target ({seed} and {d} left to fill, with the caller's own fields): a
    seeded [d, d] weight `self.w`, a static input `self.x` refreshed in prepare(), a static output `self.out`.
    `step` is the step's body; `init` and `prepare` add lines to those methods (each line 8-space indented)."""
    return f"""
import torch
{imports}

class Target:
    def __init__(self):
        g = torch.Generator().manual_seed({{seed}})
        self.w = torch.randn({{d}}, {{d}}, generator=g) * 0.1
        self.x = torch.zeros(1, {{d}})
        self.out = torch.zeros(1, {{d}})
{init}

    def prepare(self, i):
        self.x.copy_(torch.randn(1, {{d}}))
{prepare}

    def step(self):
{step}

def make(device):
    return Target()
"""


def marked_line(path: Path, marker: str) -> int:
    return next(n for n, t in enumerate(path.read_text().splitlines(), 1) if marker in t)


def table(bad) -> str:
    """The findings a failed assertion shows."""
    return bad[["category", "line", "op", "message"]].to_string()


def blocking(path: Path):
    """The blocking findings of a CPU scan of the target at path."""
    import audit

    return audit.scan(f"{path}:make", device="cpu").blocking()


def at(bad, category: str, line: int):
    """The findings of one category at one line."""
    return bad[(bad.category == category) & (bad.line == line)]
