"""assert_graph_ready and the `graph_ready` fixture (pytest11 entry point), as a user's suite sees them."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from audit.testing import assert_graph_ready

PLANTED = Path(__file__).parent / "planted"
HOST_SYNC = PLANTED / "host_sync.py"


def _hazard_lines(path: Path, category: str, func_start: str = "class HostSync:") -> list[int]:
    text = path.read_text().splitlines()
    end = next((i for i, ln in enumerate(text) if ln.startswith("class ") and i > 0
                and not ln.startswith(func_start)), len(text))
    return [i for i, ln in enumerate(text[:end], 1) if f"# HAZARD: {category}" in ln]


def test_failure_message_is_the_table():
    with pytest.raises(AssertionError) as e:
        assert_graph_ready(f"{HOST_SYNC}:make", device="cpu", steps=3)
    msg = str(e.value)
    head, *rest = msg.splitlines()
    assert "is not graph-ready" in head and "at or above silent-corruption" in head
    assert rest[1].split() == ["severity", "category", "site", "called", "from", "op", "n/step", "message"]
    for line in _hazard_lines(HOST_SYNC, "host-sync"):
        assert f"host_sync.py:{line} (step)" in msg, line
    assert "usual fixes:" in msg and "Traceback" not in msg
    assert "step-allocation" not in msg  # info rows are not failures


def test_allow_by_category_and_site():
    assert_graph_ready(f"{HOST_SYNC}:make", steps=3, allow=["host-sync"])
    assert_graph_ready(f"{HOST_SYNC}:make", steps=3, allow=["planted/host_sync.py:step"])
    lines = _hazard_lines(HOST_SYNC, "host-sync")
    keep = random.Random(int.from_bytes(os.urandom(4), "little")).choice(lines)
    allow = [f"host_sync.py:{ln}" for ln in lines if ln != keep]
    with pytest.raises(AssertionError) as e:
        assert_graph_ready(f"{HOST_SYNC}:make", steps=3, allow=allow)
    msg = str(e.value)
    assert "1 finding(s) at or above" in msg and f"({len(lines) - 1} more allowed)" in msg
    assert f"host_sync.py:{keep} (step)" in msg
    with pytest.raises(AssertionError):  # a path that is not a suffix at a separator allows nothing
        assert_graph_ready(f"{HOST_SYNC}:make", steps=3, allow=["ost_sync.py:step"])


@pytest.mark.parametrize("allow", [["host_sync"], ["sync"], [3]])
def test_bad_allow_entry(allow):
    with pytest.raises(ValueError, match="allow entry"):
        assert_graph_ready(f"{HOST_SYNC}:make", steps=3, allow=allow)


def test_static_dsv4_path_is_graph_ready_and_reference_is_not():
    inv = assert_graph_ready("dsv4:tiny", device="cpu", steps=2, warmup=1, path="static")
    assert inv.meta["path"] == "static" and inv.meta["audited_steps"] == 2
    with pytest.raises(AssertionError) as e:
        assert_graph_ready("dsv4:tiny", device="cpu", steps=2, warmup=1, path="reference")
    assert "dsv4/" in str(e.value) and "host-sync" in str(e.value)


def test_fixture_through_the_entry_point(tmp_path):
    """A user's suite in its own directory: the fixture comes from the installed plugin, the failure shows
    the table and no frame of the auditor."""
    (tmp_path / "decoder.py").write_text(textwrap.dedent("""
        import torch

        class Step:
            def __init__(self, device, sync):
                self.x, self.out, self.sync = torch.zeros(8, device=device), torch.zeros(8, device=device), sync

            def prepare(self, i):
                self.x.copy_(torch.randn(8))

            def step(self):
                torch.mul(self.x, 2, out=self.out)
                if self.sync:
                    return self.out.sum().item()  # the planted host read

        def make(device):
            return Step(device, True)

        def make_clean(device):
            return Step(device, False)
    """))
    (tmp_path / "test_user.py").write_text(textwrap.dedent("""
        from audit.testing import assert_graph_ready

        def test_planted(graph_ready):
            graph_ready("decoder.py:make", steps=3)

        def test_allowed(graph_ready):
            graph_ready("decoder.py:make", steps=3, allow=["host-sync"])

        def test_clean():
            assert_graph_ready("decoder.py:make_clean", steps=3)

        def test_device_option(request):
            assert request.config.getoption("--graph-ready-device") == "cpu"
    """))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--graph-ready-device",
                          "cpu", str(tmp_path / "test_user.py")], capture_output=True, text=True, cwd=tmp_path,
                         env=env, timeout=300)
    out = res.stdout + res.stderr
    assert res.returncode == 1 and "1 failed, 3 passed" in out, out
    assert "decoder.py:make is not graph-ready: 1 finding(s)" in out and "decoder.py:14 (step)" in out
    assert "severity" in out and "usual fixes:" in out
    assert "audit/scan" not in out and "audit/testing.py" not in out and "pytest_plugin.py" not in out, out
