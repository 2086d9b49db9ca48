"""A library callback object that changes the pipeline's state is reported at its own statement.

A `callback_on_step_end`-style object (`GuidanceCutoff.__call__` setting `pipe._guidance_scale = 0.0`) is called
by the library's step function as `callback(pipe, i, t, kwargs)`. It runs no torch op, the pipeline object's
class holds no statement that writes the attribute outside `__init__`, and the functions that ran ops hold none
either: the finding had no source line. The functions those call by name (a dunder included) are searched next.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, clean_or_hit, install_library, module_target, write_target

LIB = """
import torch


class PipelineState:
    def __init__(self):
        self.{attr} = 5.0


class Cutoff:
    def __init__(self, at):
        self.at = at

    def __call__(self, pipe, i, latents):
        if i == self.at:
            {line}
        return latents


def denoise_step(pipe, lin, x, i, callback=None):
    h = lin(x) * 0.5
    if callback is not None:
        h = callback(pipe, i, h)
    return h
"""

LINES = {
    "assign": "pipe.{attr} = 0.0  # LIBSITE",
    "augmented": "pipe.{attr} -= 1.0  # LIBSITE",
    "setattr": "setattr(pipe, '{attr}', 0.0)  # LIBSITE",
    "clean": "seen = i  # LIBSITE",
}

TARGET = module_target(imports="from {mod} import Cutoff, PipelineState, denoise_step", init="""\
        self.lin = nn.Linear({d}, {d})
        self.pipe = PipelineState()
        self.cb = Cutoff(4)
        self.i = 0""", prepare="        self.i = i", step="""\
        h = denoise_step(self.pipe, self.lin, self.x, self.i, callback=self.cb)  # SITE
        self.out.copy_(h)
        return self.out""")


@pytest.mark.parametrize("kind", sorted(LINES))
def test_a_callback_object_writing_the_pipeline(tmp_path, monkeypatch, kind):
    attr = random.choice(["_guidance_scale", "guidance", "_cfg_scale"])
    src = LIB.replace("{line}", LINES[kind]).replace("{attr}", attr)
    mod, lib = install_library(tmp_path, monkeypatch, src, "cb_lib")
    path, site = write_target(tmp_path / "target" / "cb_target.py", TARGET, mod=mod,
                              seed=random.randrange(2**31), d=random.choice([4, 8, 16]))
    bad = blocking(path, forget=mod)
    clean_or_hit(bad, kind, "cpu-side-effect", lib, path, site)
