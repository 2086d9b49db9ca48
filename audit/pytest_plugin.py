"""pytest plugin (entry point pytest11 `dsv4_audit`): the `graph_ready` fixture and `--graph-ready-device`.

Loaded in every pytest run of an environment that has dsv4-audit installed, so it imports nothing
heavy until a test asks for the fixture. The same suite runs on CPU in CI (CPU scans see what would
sync on a GPU) and with `--graph-ready-device cuda` on a GPU machine.
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser):
    parser.getgroup("dsv4-audit").addoption(
        "--graph-ready-device", default="cpu",
        help="device the graph_ready fixture scans on (cpu | cuda | cuda:N; default cpu)")


@pytest.fixture
def graph_ready(request):
    """assert_graph_ready with the device of --graph-ready-device: graph_ready(make, steps=4, allow=[...])."""
    from audit.testing import assert_graph_ready

    device = request.config.getoption("--graph-ready-device")

    def check(make, steps: int = 4, allow=(), **kw):
        __tracebackhide__ = True
        kw.setdefault("device", device)
        return assert_graph_ready(make, steps=steps, allow=allow, **kw)

    return check
