"""A library's device test written as a call of its own helper (accelerate's `clear_device_cache()`:
`elif is_cuda_available(): torch.cuda.empty_cache()`, where the helper returns a local bound to
`torch.cuda.is_available()` inside a `with`). A CPU scan never takes that side; a GPU does, inside the captured
region. The helper is read through its returns; a helper whose return depends on data is not a device test.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, install_library, library_hit, matmul_target, table, write_target

LIB = """
import contextlib
import functools
import os
import torch

@contextlib.contextmanager
def patched_env(**kw):
    old = {{k: os.environ.get(k) for k in kw}}
    os.environ.update(kw)
    try:
        yield
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)

{helpers}

def is_other_available():
    return hasattr(torch, "not_a_backend_{tag}")

def clear_cache(flag=False):
    if flag:
        pass
    if is_other_available():
        pass
    elif {test}:
        torch.cuda.{wait}()  # LIBSITE
"""

# helpers whose every return says whether CUDA is there
CUDA_HELPERS = {
    "local in a with": """
def helper():
    with patched_env(NVML_CHECK="1"):
        available = torch.cuda.is_available()
    return available
""",
    "cached, two hops": """
@functools.lru_cache
def _probe():
    return torch.cuda.is_available()

def helper():
    try:
        return _probe()
    except RuntimeError:
        return False
""",
    "negated twice": """
def helper():
    missing = not torch.cuda.is_available()
    return not missing
""",
}
# helpers whose value depends on more than the device: not read
DATA_HELPERS = {
    "data": """
def helper():
    return os.environ.get("USE_GPU_{tag}", "") == "1"
""",
    "mixed returns": """
def helper():
    if os.environ.get("FORCE_{tag}"):
        return True
    return torch.cuda.is_available()
""",
}


def _scan(tmp_path, monkeypatch, helper: str, test: str = "helper()"):
    tag = random.randrange(10**6)
    wait = random.choice(["empty_cache", "synchronize"])
    src = LIB.format(helpers=helper.replace("{tag}", str(tag)), test=test, wait=wait, tag=tag)
    mod, lib = install_library(tmp_path, monkeypatch, src, prefix="devcache")
    tpl = matmul_target(imports=f"from {mod} import clear_cache", step="""        self.out.copy_(torch.tanh(self.x @ self.w))
        clear_cache()  # SITE
        return self.out""")
    path, site = write_target(tmp_path / "target" / "cache_target.py", tpl, seed=random.randrange(2**31),
                              d=random.choice([4, 8, 16]))
    return blocking(path, forget=mod), lib, path, site


@pytest.mark.parametrize("kind", sorted(CUDA_HELPERS))
def test_a_wait_behind_a_cuda_helper_is_found_with_the_targets_call(tmp_path, monkeypatch, kind):
    test = random.choice(["helper()", "helper() and torch.cuda.is_available()", "not not helper()"])
    bad, lib, path, site = _scan(tmp_path, monkeypatch, CUDA_HELPERS[kind], test)
    library_hit(bad, "host-sync", lib, path, site)


@pytest.mark.parametrize("kind", sorted(DATA_HELPERS))
def test_a_helper_that_reads_data_is_not_a_device_test(tmp_path, monkeypatch, kind):
    bad, lib, path, site = _scan(tmp_path, monkeypatch, DATA_HELPERS[kind])
    assert not len(bad[bad.category == "host-sync"]), table(bad)
