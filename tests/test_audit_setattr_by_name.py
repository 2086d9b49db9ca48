"""cpu-side-effect sites for attributes set by name: `setattr(obj, name, v)` with a computed name (request
options applied onto a config), an f-string name (`setattr(self, f"n_{phase}", ...)`), and writes through
the instance dict (`self.__dict__["n"] = v`, `vars(self).update(n=v)`). The change is seen in the state
snapshots; the statement is now found in the source, not left as "no source line found"."""

from __future__ import annotations

import random

from site_util import blocking, module_target, table, write_target

TARGET = module_target(prelude="""
class Opts:
    def __init__(self):
        self.{attr} = 0
""", init="""\
        self.opts = Opts()
        self.w = torch.randn({d}, {d})
        self.req = {{"{attr}": 0}}""", prepare='        self.req = {{"{attr}": i}}', step="""\
        for name, value in self.req.items():
            {write}  # SITE
        self.out.copy_(self.x @ self.w)
        return self.out""")

WRITES = [
    "setattr(self.opts, name, value)",
    'setattr(self.opts, f"{{name}}", value)',
    "self.opts.__dict__[name] = value",
    "vars(self.opts)[name] = value",
    "vars(self.opts).update({{name: value}})",
]


def test_an_attribute_set_by_a_computed_name_has_its_statement_as_site(tmp_path):
    write = random.choice(WRITES)
    attr = random.choice(["temperature", "top_k", "n_decode"])
    path, site = write_target(tmp_path / "by_name_target.py", TARGET.replace("{write}", write), attr=attr,
                              seed=random.randrange(2**31), d=random.choice([4, 8]))
    bad = blocking(path)
    hit = bad[bad.category == "cpu-side-effect"]
    assert set(hit.line) == {site}, (write, table(bad))
