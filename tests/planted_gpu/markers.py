"""`# HAZARD: <category>[, <category>]` markers of a planted file: the lines the tests expect.

A line may add `# CUDA: <category>` for a hazard that exists only when the step runs on a GPU
(e.g. `torch.tensor(data, device=...)` is also a pageable host->device copy there)."""

from __future__ import annotations

import re
from pathlib import Path

MARK = re.compile(r"#\s*HAZARD:\s*([a-z\-, ]+)")
CUDA_MARK = re.compile(r"#\s*CUDA:\s*([a-z\-, ]+)")


def markers(path, cuda: bool = False) -> set[tuple[int, str]]:
    out = set()
    for n, text in enumerate(Path(path).read_text().splitlines(), 1):
        for pat in (MARK, CUDA_MARK) if cuda else (MARK,):
            m = pat.search(text)
            if m:
                out |= {(n, c.strip()) for c in m.group(1).split(",") if c.strip()}
    return out


def found(inv, path, severities=("blocks-capture", "silent-corruption", "performance")) -> set[tuple[int, str]]:
    """(line, category) of the findings in `path` (info findings left out by default)."""
    df = inv.df
    df = df[df.file.astype(str).str.endswith(Path(path).name) & df.severity.isin(severities)]
    return set(zip(df.line.astype(int), df.category))
