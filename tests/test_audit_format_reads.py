"""Formatting a tensor (`f"{t}"`, `str(t)`, `"%s" % t`, `print(t)`) reads it back inside torch's repr through
`__bool__`, `.item()` and `.tolist()`: one line the user wrote, one host-sync finding naming the others, at the
library's line with the target's call as caller.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, library_hit, library_target

LIB = """
import io
import torch

SINK = io.StringIO()

def scaled(x, k):
    s = x.abs().mean() * k
    {form}  # LIBSITE
    return x * 0.5
"""
FORMS = ['SINK.write(f"mean={s}")', "SINK.write(str(s))", 'SINK.write("%s" % s)', "print(s, file=SINK)",
         'SINK.write(f"mean={s.view(1)}")']


@pytest.mark.parametrize("form", FORMS)
def test_formatting_a_tensor_is_one_host_read(tmp_path, monkeypatch, form):
    k = round(random.uniform(0.5, 2.0), 3)
    mod, lib, path, site = library_target(tmp_path, monkeypatch, LIB.replace("{form}", form), "fmt", "scaled",
                                          f"scaled(self.x @ self.w, {k})")
    hit = library_hit(blocking(path, forget=mod), "host-sync", lib, path, site)
    assert hit.iloc[0].count_per_step > 0
