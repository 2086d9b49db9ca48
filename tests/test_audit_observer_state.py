"""cpu-side-effect and state the auditor's own snapshot changes.

A step's state is snapshotted around each audited step. Reading it must not change it: a library's
`__repr__` that memoizes its text (beartype's `BeartypeConf._repr`) ran when a snapshot named the object as a
dict key, and the next snapshot saw `_repr` go from None to the text; the interpreter's source cache
(`linecache.cache`, which beartype binds as a module global) grows whenever the tracer reads a new file in
the middle of a step; the module table (`sys.modules`, beartype's `module_imported_names`) grows when a step
imports a module lazily. Neither is anything the step did, and a replay computes the same: no finding."""

from __future__ import annotations

import random

from site_util import blocking, install_library, module_target, table, write_target

CONF_TARGET = module_target(prelude="""
class {cls}:
    def __init__(self, level):
        self.level = level
        self._text = None

    def __repr__(self):
        if self._text is None:
            self._text = f"{cls}(level={{self.level}})"
        return self._text

    def __hash__(self):
        return hash(self.level)

    def __eq__(self, other):
        return isinstance(other, {cls}) and other.level == self.level


_CONF = {cls}({level})
{by_name} = {{"default": _CONF}}
{by_conf} = {{_CONF: {flag}}}
""", init="""\
        self.w = torch.randn({d}, {d})""", step="""\
        h = torch.tanh(self.x @ self.w)  # SITE
        self.out.copy_(h)
        return self.out""")


def test_a_memoizing_repr_of_a_dict_key_is_not_a_change(tmp_path):
    tag = random.randrange(10**6)
    (tmp_path / "target").mkdir()
    path, _ = write_target(tmp_path / "target" / f"conf_{tag}.py", CONF_TARGET, cls=f"Conf{tag}",
                           level=random.randrange(1, 9), by_name=f"BY_NAME_{tag}", by_conf=f"BY_CONF_{tag}",
                           flag=random.choice(["True", "1", "'on'"]), seed=random.randrange(2**31),
                           d=random.choice([4, 8]))
    bad = blocking(path)
    assert bad.empty, table(bad)


LIB = """
import torch


def mix_{tag}(x, w):
    return torch.relu(x @ w) + {bias}
"""

LINES_TARGET = module_target(imports="import linecache\nfrom {mod} import mix_{tag}", prelude="""
{alias} = linecache.cache
""", init="""\
        self.w = torch.randn({d}, {d})""", step="""\
        h = mix_{tag}(self.x, self.w)  # SITE
        self.out.copy_(h)
        return self.out""")


def test_the_source_cache_bound_as_a_global_is_not_step_state(tmp_path, monkeypatch):
    tag = random.randrange(10**6)
    mod, _ = install_library(tmp_path, monkeypatch, LIB.format(tag=tag, bias=random.choice([0.5, 1.0, 2.0])),
                             prefix="srcmix")
    path, _ = write_target(tmp_path / "target" / f"lines_{tag}.py", LINES_TARGET, mod=mod, tag=tag,
                           alias=random.choice(["_LINES", "linecache_cache", "SRC_CACHE"]),
                           seed=random.randrange(2**31), d=random.choice([4, 8]))
    bad = blocking(path, forget=mod)
    assert bad.empty, table(bad)


MODULES_LIB = """
import torch


def mix_{tag}(x, w):
    import {lazy}  # imported on first use: the interpreter's module table grows by one during a step
    return torch.relu(x @ w) * {lazy}.SCALE
"""


def test_the_module_table_bound_as_a_global_is_not_step_state(tmp_path, monkeypatch):
    """A library that binds `sys.modules` (beartype's alias of it) while the step imports a module lazily:
    the table grows by one during a step, which a replay needs no more than the first import."""
    tag = random.randrange(10**6)
    lazy, _ = install_library(tmp_path, monkeypatch, f"SCALE = {random.choice([0.5, 2.0])}\n", prefix="lazy")
    mod, _ = install_library(tmp_path, monkeypatch, MODULES_LIB.format(tag=tag, lazy=lazy), prefix="modtab")
    tpl = LINES_TARGET.replace("{alias} = linecache.cache", "from sys import modules as {alias}").replace(
        "    def prepare(self, i):\n", "    def prepare(self, i):\n        {alias}.pop('{lazy}', None)  # each step imports it anew\n")
    path, _ = write_target(tmp_path / "target" / f"modtab_{tag}.py", tpl, mod=mod, tag=tag, lazy=lazy,
                           alias=random.choice(["imported", "_MODULES", "module_imported_names"]),
                           seed=random.randrange(2**31), d=random.choice([4, 8]))
    bad = blocking(path, forget=mod)
    assert bad.empty, table(bad)
