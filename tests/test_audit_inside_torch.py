"""Host reads that torch's own Python code makes for a library line.

A sampling helper builds `torch.distributions.Categorical(logits=...)` (or `Normal(mu, sigma).log_prob(a)`) in the
step: by default a distribution checks its arguments on the host (`validate_args`), a read back of a device tensor
that the line itself does not show. The finding stays at the library's line, with the target's call as caller; its
message names the torch functions that read, and its fix the switch (`validate_args=False`). With the switch off the
same helper is clean. `if tok in ids:` is `Tensor.__contains__`, which the message names too.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, clean_or_hit, library_target

LIB = """
import torch


def sample_scores(logits):
    {line}  # LIBSITE
    return {ret}
"""

FORMS = {
    "categorical": ("dist = torch.distributions.Categorical(logits=logits{kw})", "dist.entropy()[:, None] + logits",
                    "`Categorical.__init__` -> `Distribution.__init__`"),
    "normal": ("lp = torch.distributions.Normal(logits, logits.abs() + 1{kw}).log_prob(logits * 0.5)", "lp",
               "`Normal.__init__` -> `Distribution.__init__`"),
}


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("validate", [True, False])
def test_distribution_checks_read_back(tmp_path, monkeypatch, form, validate):
    import torch

    # torch's default (dynamo turns the checks off for the whole process once anything was compiled in it)
    monkeypatch.setattr(torch.distributions.Distribution, "_validate_args", True)
    line, ret, chain = FORMS[form]
    kw = "" if validate else ", validate_args=False"
    src = LIB.format(line=line.format(kw=kw), ret=ret)
    mod, lib, path, site = library_target(tmp_path, monkeypatch, src, "dist", "sample_scores",
                                          f"sample_scores(self.x @ self.w * {random.choice([0.5, 1.0, 2.0])})")
    bad = blocking(path, forget=mod)
    hit = clean_or_hit(bad, "hit" if validate else "clean", "host-sync", lib, path, site)
    if validate:
        f = hit.iloc[0]
        assert f"inside torch: {chain}" in f.message and "torch/distributions/distribution.py:" in f.message, f.message
        assert "validate_args=False" in f.fix, f.fix


def test_contains_is_named(tmp_path, monkeypatch):
    src = """
import torch


def drop_banned(logits, banned):
    if {tok} in banned:  # LIBSITE
        logits = logits - 1.0
    return logits
"""
    mod, lib, path, site = library_target(tmp_path, monkeypatch, src.format(tok=random.randrange(3, 9)), "ban",
                                          "drop_banned", "drop_banned(self.x @ self.w, self.banned)",
                                          init="        self.banned = torch.tensor([1, 2, 3, 5, 8])")
    hit = clean_or_hit(blocking(path, forget=mod), "hit", "host-sync", lib, path, site)
    assert "inside torch: `Tensor.__contains__` (torch/_tensor.py:" in hit.iloc[0].message, hit.iloc[0].message
