"""torch functions wrapped by `typing_extensions.deprecated` (`torch.testing.assert_allclose`, the deprecated
torch.distributed collectives) run a wrapper frame in typing_extensions, a site-packages file. It is the stdlib
`typing` module's backport and only forwards the call: a hazard inside the wrapped torch function is at the line
that called it, as for any torch function, never at the wrapper's line."""

from __future__ import annotations

import random
import warnings

import pytest
import torch

from site_util import blocking, library_hit, library_target, table

LIB = """
import warnings
import torch

def verified(x, how):
    y = torch.tanh(x) * {k}
    if how == "deprecated":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.testing.assert_allclose(y, y * 1.0)  # LIBSITE-deprecated
    elif how == "current":
        torch.testing.assert_close(y, y * 1.0)  # LIBSITE-current
    return y
"""


@pytest.mark.parametrize("how", ["deprecated", "current", "none"])
def test_a_hazard_inside_a_deprecated_torch_function_is_at_the_calling_line(tmp_path, monkeypatch, how):
    if how == "deprecated" and "typing_extensions" not in (getattr(torch.testing.assert_allclose, "__code__", None)
                                                          and torch.testing.assert_allclose.__code__.co_filename or ""):
        pytest.skip("torch.testing.assert_allclose is not a typing_extensions.deprecated wrapper in this torch")
    src = LIB.replace("{k}", str(random.choice([1, 2, 3])))
    mod, lib, path, site = library_target(tmp_path, monkeypatch, src, "verify", "verified",
                                          f'verified(self.x @ self.w, "{how}")')
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bad = blocking(path, forget=mod)
    if how == "none":
        assert not len(bad), table(bad)
        return
    library_hit(bad, "host-sync", lib, path, site, marker=f"# LIBSITE-{how}")
    assert set(bad.file) == {lib.name} or all(f.endswith(lib.name) for f in bad.file), table(bad)
