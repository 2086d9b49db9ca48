"""Planted targets written from a template: the line marked `# SITE` is where a finding must land."""

from __future__ import annotations

import textwrap
from pathlib import Path


def write_target(path: Path, template: str, marker: str = "# SITE", **fields) -> tuple[Path, int]:
    """The target file from `template` (dedented, `fields` filled in) -> (its path, the marked line's number)."""
    path.write_text(textwrap.dedent(template).format(**fields))
    return path, marked_line(path, marker)


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
