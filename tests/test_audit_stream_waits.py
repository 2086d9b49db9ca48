"""A step that waits for work issued outside it (a copy prepare() put on a copy stream): a capturing
stream cannot wait on an event its capture did not record, so the wait is reported at its line as
blocking capture; waiting in prepare() instead, or on events the step records itself, is clean."""

from __future__ import annotations

from pathlib import Path

import pytest

import audit
from test_audit_planted import markers

PLANTED = Path(__file__).parent / "planted" / "streams_prepared.py"


def _rows(factory: str, **kw):
    inv = audit.scan(f"{PLANTED}:{factory}", device="cpu", steps=4, **kw)
    return inv.df[inv.df.severity != "info"]


def _marked(text: str) -> int:
    return next(n for n, t in enumerate(PLANTED.read_text().splitlines(), 1) if text in t and "HAZARD" in t)


@pytest.mark.parametrize("factory, line", [("make", "cur.wait_stream(self.copy)"),
                                           ("make_event", "cur.wait_event(self.ready)")])
def test_a_wait_for_work_issued_in_prepare_blocks_capture_at_its_line(factory, line):
    bad = _rows(factory)
    assert list(zip(bad.line.astype(int), bad.category, bad.severity)) == \
        [(_marked(line), "unjoined-stream", "blocks-capture")], bad[["line", "category", "message"]].to_string()
    assert "recorded outside the step" in bad.message.iloc[0]
    assert "prepare()" in bad.fix.iloc[0]


def test_waiting_in_prepare_and_joining_inside_the_step_is_clean():
    bad = _rows("make_clean")
    assert bad.empty, bad[["line", "category", "message"]].to_string()


def test_a_stream_used_without_a_fork_is_one_finding_at_its_block(tmp_path):
    """Work put on a stream in the step with no fork, then waited for: the block's missing fork is the finding;
    the wait that follows is not reported a second time."""
    src = tmp_path / "unforked.py"
    src.write_text(
        "import torch\n"
        "class T:\n"
        "    def __init__(self):\n"
        "        self.s = torch.cuda.Stream()\n"
        "        self.x = torch.randn(8)\n"
        "    def prepare(self, i):\n"
        "        self.x.copy_(torch.randn(8))\n"
        "    def step(self):\n"
        "        with torch.cuda.stream(self.s):\n"
        "            y = self.x * 2\n"
        "        torch.cuda.current_stream().wait_stream(self.s)\n"
        "        return y + 1\n"
        "def make(device):\n"
        "    return T()\n")
    inv = audit.scan(f"{src}:make", device="cpu", steps=3)
    bad = inv.df[inv.df.severity != "info"]
    assert list(zip(bad.line.astype(int), bad.op)) == [(9, "stream fork")], bad[["line", "op", "message"]].to_string()


def test_the_planted_markers_are_what_the_scan_reports():
    bad = _rows("make")
    assert set(zip(bad.line.astype(int), bad.category)) == {m for m in markers(PLANTED)
                                                           if m[0] == _marked("cur.wait_stream(self.copy)")}
