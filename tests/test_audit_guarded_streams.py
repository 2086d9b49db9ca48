"""Side-stream blocks on the GPU arm of a device test, which a CPU scan never runs: a block with no fork before
it, or no join after it, is reported at its `with` line from the source; the forked and joined twin is clean."""

from __future__ import annotations

from pathlib import Path

import pytest

import audit
from test_audit_planted import markers

PLANTED = Path(__file__).parent / "planted" / "streams_guarded.py"


def _bad(factory: str):
    inv = audit.scan(f"{PLANTED}:{factory}", device="cpu", steps=4)
    return inv.df[inv.df.severity != "info"]


def _marked(cls: str) -> int:
    lines = PLANTED.read_text().splitlines()
    start = next(n for n, t in enumerate(lines, 1) if t.startswith(f"class {cls}("))
    return next(n for n, _ in sorted(markers(PLANTED)) if n > start)


@pytest.mark.parametrize("factory, cls, kind", [("make", "NoFork", "stream fork"), ("make_nojoin", "NoJoin", "stream join")])
def test_a_side_stream_block_on_the_gpu_arm_is_read_from_the_source(factory, cls, kind):
    bad = _bad(factory)
    assert list(zip(bad.line.astype(int), bad.category, bad.op)) == [(_marked(cls), "unjoined-stream", kind)], \
        bad[["line", "category", "op", "message"]].to_string()
    assert "did not take" in bad.message.iloc[0]


def test_the_forked_and_joined_block_is_clean():
    bad = _bad("make_clean")
    assert bad.empty, bad[["line", "category", "message"]].to_string()
