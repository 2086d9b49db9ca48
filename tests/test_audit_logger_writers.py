"""A logger's writer that appends a record in the step is reported at its own append.

The step logs a value through a library logger (`logger.log(Record(v))`): a generic field converter runs the
torch ops (`setattr(rec, name, fn(v))` over every field, as a collection-apply helper does), then the logger's
writer appends the record to its list and, every N records, flushes it (`self.rows = []`). The writer's methods
run no torch op. Two wrong sites were named: the converter's computed `setattr`, since it ran ops and can set
any name, though the writer's own class spells `self.rows.append(...)`; and the flush, which the step's code
reaches by name but whose `self.rows = []` cannot leave a list that grew by one.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, install_library, library_hit, module_target, table, write_target

LIB = """
import torch


class Record:
    def __init__(self, value):
        self.value = value


def convert_fields(rec, fn):
    for name in list(vars(rec)):
        v = getattr(rec, name)
        setattr(rec, name, fn(v) if isinstance(v, torch.Tensor) else v)
    return rec


class Writer:
    def __init__(self):
        self.{attr} = []

    def add(self, rec):
        self.{attr}.append(rec)  # LIBSITE

    def flush(self):
        self.written = len(self.{attr})
        self.{attr} = []


class Logger:
    def __init__(self, every):
        self.writer = Writer()
        self.every = every

    def log(self, value):
        rec = {convert}
        self.writer.add(rec)
        if {flush}len(self.writer.{attr}) % self.every == 0:
            self.writer.flush()
"""

TARGET = module_target(imports="import {mod} as lib", init="""\
        self.w = torch.randn({d}, {d})
        self.logger = lib.Logger(every=10**6)""", step="""\
        self.out.copy_(torch.tanh(self.x @ self.w))
        self.logger.log(self.out.sum())  # SITE
        return self.out""")


@pytest.mark.parametrize("kind", ["converted", "flushed", "both"])
def test_a_writer_append_is_the_site_not_a_converter_or_a_flush(tmp_path, monkeypatch, kind):
    attr = random.choice(["rows", "metrics", "records"])
    convert = "convert_fields(Record(value), lambda t: t.detach() * 1.0)" if kind != "flushed" else \
        "Record(value * 1.0)"
    flush = "False and " if kind == "converted" else ""
    mod, lib = install_library(tmp_path, monkeypatch, LIB.format(attr=attr, convert=convert, flush=flush),
                               prefix="loggers")
    path, site = write_target(tmp_path / "target" / "log_target.py", TARGET, mod=mod,
                              seed=random.randrange(2**31), d=random.choice([4, 8]))
    bad = blocking(path, forget=mod)
    library_hit(bad, "cpu-side-effect", lib, path, site)
    assert len(bad[bad.category == "cpu-side-effect"]) == 1, table(bad)
