"""A library that frees or waits when the CUDA caching allocator holds much memory
(`if torch.cuda.memory_reserved() > limit: torch.cuda.empty_cache()`). Without CUDA the counters read 0, so
a CPU scan never takes that side; a GPU holding memory does, inside the captured region. The side where the
counter is above the bound is read as a GPU's side (the other one for `<`); a test on data is not.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, install_library, library_hit, matmul_target, table, write_target

LIB = """
import torch

def trim(limit):
    if {test}:
        {body}
    else:
        {orelse}
"""

# (test, the side holding the wait): the side a GPU holding memory takes and a CPU scan never does
GPU_SIDE = [("torch.cuda.memory_reserved() > limit", "body"), ("limit < torch.cuda.memory_allocated()", "body"),
            ("torch.cuda.max_memory_allocated() >= limit", "body"), ("not torch.cuda.memory_reserved() <= limit", "body"),
            ("torch.cuda.memory_reserved() < limit", "orelse"), ("limit > torch.cuda.memory_allocated()", "orelse")]
# a test on data, or one whose sides do not follow the counter's size: no side is the GPU's
NOT_READ = ["limit < 0", "torch.cuda.memory_reserved() == limit"]


def _scan(tmp_path, monkeypatch, test: str, side: str = "body"):
    wait = f"torch.cuda.{random.choice(['empty_cache', 'synchronize'])}()  # LIBSITE"
    body, orelse = (wait, "pass") if side == "body" else ("pass", wait)
    mod, lib = install_library(tmp_path, monkeypatch, LIB.format(test=test, body=body, orelse=orelse), prefix="trim")
    tpl = matmul_target(imports=f"from {mod} import trim", step="""        self.out.copy_(torch.tanh(self.x @ self.w))
        trim({limit})  # SITE
        return self.out""")
    path, site = write_target(tmp_path / "target" / "trim_target.py", tpl, seed=random.randrange(2**31),
                              d=random.choice([4, 8, 16]), limit=random.randrange(1, 1 << 30))
    return blocking(path, forget=mod), lib, path, site


@pytest.mark.parametrize("test,side", GPU_SIDE)
def test_a_wait_behind_an_allocator_counter_is_found_with_the_targets_call(tmp_path, monkeypatch, test, side):
    bad, lib, path, site = _scan(tmp_path, monkeypatch, test, side)
    library_hit(bad, "host-sync", lib, path, site)


@pytest.mark.parametrize("test", NOT_READ)
def test_a_test_that_does_not_follow_the_counter_is_not_read(tmp_path, monkeypatch, test):
    bad, lib, path, site = _scan(tmp_path, monkeypatch, test)
    assert not len(bad[bad.category == "host-sync"]), table(bad)
