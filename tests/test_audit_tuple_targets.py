"""State a library changes through a tuple assignment: `self.n, self.last = self.n + 1, name`.

One statement writes two places, and its target is one `ast.Tuple`: the source readers that find the statement
behind a cpu-side-effect did not look inside it, and the finding had no line. Attributes of an object and slots
of a module-global dict written that way are reported at that statement, with the target's call as caller; a
tuple assignment into locals changes no state.
"""

from __future__ import annotations

import pytest

from site_util import blocking, clean_or_hit, library_target

LIB = """
import torch

_SCOPE = {"adapter": None, "depth": 0}

class Router:
    def __init__(self):
        self.n = 0
        self.last = None

    def route(self, x, how):
        if how == "attrs":
            self.n, self.last = self.n + 1, x.shape[0]  # LIBSITE attrs
        elif how == "global":
            _SCOPE["adapter"], _SCOPE["depth"] = "de", _SCOPE["depth"] + 1  # LIBSITE global
        elif how == "starred":
            [*self.last, self.n] = [x.shape[0], self.n + 1]  # LIBSITE starred
        else:
            a, b = x.shape[0], 1  # LIBSITE clean
        return torch.tanh(x)

ROUTER = Router()
"""


@pytest.mark.parametrize("how", ["attrs", "global", "starred", "clean"])
def test_state_written_by_a_tuple_assignment_is_reported_at_that_statement(tmp_path, monkeypatch, how):
    mod, lib, path, site = library_target(tmp_path, monkeypatch, LIB, "tuples", "ROUTER",
                                          f'ROUTER.route(self.x @ self.w, "{how}")')
    clean_or_hit(blocking(path, forget=mod), how, "cpu-side-effect", lib, path, site, marker=f"# LIBSITE {how}")
