"""After every audit test (this file sorts after them): torch is as torch made it.

The CPU scan stands in for torch's tensor factories during a step (audit.scan.standins.pinned) and restores them after.
Dynamo builds its tables of torch functions on first use and keeps them; a table built while the stand-ins
were in place made every later compile in the process break its graph on the real `torch.arange`
(audit.scan.standins.dynamo_rules drops such tables). Run after the audit tests, as in `pytest -q`, this failed
before that fix; on its own it checks only the process it runs in.
"""

from __future__ import annotations

import random
import sys

import torch


def test_factories_and_dynamo_tables_are_torch_s_own():
    assert type(torch.arange).__name__ == "builtin_function_or_method", torch.arange
    tr = sys.modules.get("torch._dynamo.trace_rules")
    if tr is not None and tr.get_torch_obj_rule_map.cache_info().currsize:
        assert torch.arange in tr.get_torch_obj_rule_map(), "Dynamo's torch-function table lost torch.arange"


def test_a_compile_after_the_scans_has_no_graph_break():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    n = random.randrange(3, 9)

    @torch.compile(backend="eager")
    def ramp(x):
        return torch.arange(x.shape[-1], dtype=x.dtype) * x

    x = torch.randn(2, n)
    assert torch.equal(ramp(x), torch.arange(n, dtype=x.dtype) * x)
    assert not counters["graph_break"], dict(counters["graph_break"])
