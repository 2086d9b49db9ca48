"""The target hands one of its objects to library code (`SectionTimer(self.times, "mlp")`), and the
library changes it under its own name: in a method of the class it was passed to, through the attribute
`__init__` keeps it in (`self.store[...]`), or in the function it was passed to, through the parameter.
No torch op runs there, so no op stack leads to the line. The finding is the library's statement, with
the target's call that handed the object over as its caller.
"""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, install_library, marked_line, matmul_target, table, write_target

LIB = {
    "class": """
        class Recorder:
            def __init__(self, store, name):
                self.store, self.name = store, name

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.store.setdefault(self.name, []).append(1)  # LIBSITE
                return False

            def dry(self):
                return len(self.store)
        """,
    "function": """
        def record(store, name, dry=False):
            if dry:
                return store
            store.setdefault(name, []).append(1)  # LIBSITE
            return store
        """,
}
BLOCK = "\n        if True:"  # the step's body below the call: a `with` block, or a plain one
CALLS = {"class": ("with {mod}.Recorder(self.stats, 'mlp'):  # SITE", "{mod}.Recorder(self.stats, 'mlp').dry()  # SITE" + BLOCK),
         "function": ("{mod}.record(self.stats, 'mlp')  # SITE" + BLOCK, "{mod}.record(self.stats, 'mlp', dry=True)  # SITE" + BLOCK)}

TARGET = matmul_target(
    imports="import {mod}", init="        self.stats = {{}}",
    step="        {call}\n            h = torch.tanh(self.x @ self.w)\n        self.out.copy_(h)\n        return self.out")


def _write(tmp_path, monkeypatch, kind: str, changes: bool):
    mod, lib = install_library(tmp_path, monkeypatch, LIB[kind], "handoff_lib")
    call = CALLS[kind][0 if changes else 1].format(mod=mod)
    path, site = write_target(tmp_path / "target" / "handoff_target.py", TARGET, mod=mod, call=call,
                              seed=random.randrange(2**31), d=random.choice([4, 8]))
    return path, site, lib, mod


@pytest.mark.parametrize("kind", sorted(LIB))
def test_a_library_change_to_a_handed_object_is_found_at_the_librarys_line(tmp_path, monkeypatch, kind):
    path, site, lib, mod = _write(tmp_path, monkeypatch, kind, changes=True)
    bad = blocking(path, forget=mod)
    hit = bad[(bad.category == "cpu-side-effect") & bad.file.str.endswith(lib.name)
              & (bad.line == marked_line(lib, "# LIBSITE"))]
    assert len(hit) == 1, table(bad)
    assert hit.iloc[0].caller_file.endswith(path.name) and int(hit.iloc[0].caller_line) == site
    assert not len(at(bad, "cpu-side-effect", 0)), table(bad)


@pytest.mark.parametrize("kind", sorted(LIB))
def test_a_library_that_only_reads_it_is_not(tmp_path, monkeypatch, kind):
    path, _, _, mod = _write(tmp_path, monkeypatch, kind, changes=False)
    bad = blocking(path, forget=mod)
    assert not len(bad[bad.category == "cpu-side-effect"]), table(bad)
