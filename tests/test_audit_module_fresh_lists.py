"""cpu-side-effect: a module attribute each step rebinds to a list of tensors it made is no state a replay misses.

LDM's `LitEma` (an nn.Module) swaps EMA weights in around a forward: `store()` keeps
`self.collected_params = [p.clone() for p in params]`, `restore()` copies them back into the parameters in the
same step. Each step's list holds that step's clones, in place of the previous step's, and no later step reads
them: under capture the attribute keeps the graph's clones and every replay rewrites them, as for a plain
object's slot (fresh_slots). `Module.__setattr__` leaving a store record does not change that. A twin whose
clones a later step reads (restored at the start of the next step) is step-allocation's escape, not a
cpu-side-effect. Sizes, names and the spelling of the list are drawn fresh."""

from __future__ import annotations

import random

from site_util import blocking, module_target, table, write_target

PRELUDE = """
class Keeper(nn.Module):
    def __init__(self):
        super().__init__()
        self.{name} = []

    def store(self, params):
        self.{name} = {spelling}

    def restore(self, params):
        for c, p in zip(self.{name}, params):
            p.data.copy_(c.data)
"""

SPELLINGS = ["[p.clone() for p in params]", "[p.detach().clone() for p in params]",
             "list(map(torch.clone, params))"]


def _scan(tmp_path, later: bool):
    d = random.choice([4, 6, 8])
    name = random.choice(["collected_params", "backup", "_saved"])
    prelude = PRELUDE.format(name=name, spelling=random.choice(SPELLINGS))
    if later:  # restore the previous step's clones first: a later step reads them
        step = ("        if self.k.{n}:\n            self.k.restore(list(self.lin.parameters()))\n"
                "        self.k.store(list(self.lin.parameters()))  # SITE\n"
                "        self.out.copy_(self.lin(self.x))\n        return self.out").format(n=name)
    else:
        step = ("        self.k.store(list(self.lin.parameters()))  # SITE\n"
                "        self.out.copy_(self.lin(self.x))\n"
                "        self.k.restore(list(self.lin.parameters()))\n        return self.out")
    tpl = module_target(prelude=prelude, init=f"        self.lin = nn.Linear({d}, {d})\n        self.k = Keeper()",
                        step=step)
    path, _ = write_target(tmp_path / "fresh_lists.py", tpl, seed=random.randrange(2**31), d=d)
    return blocking(path)


def test_a_module_list_of_the_steps_own_clones_is_clean(tmp_path):
    bad = _scan(tmp_path, later=False)
    assert not len(bad), table(bad)


def test_clones_a_later_step_reads_are_an_escape_not_a_side_effect(tmp_path):
    bad = _scan(tmp_path, later=True)
    assert set(bad.category) == {"step-allocation"}, table(bad)
