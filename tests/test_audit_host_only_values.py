"""A tensor built from changing Python data that never reaches a kernel (audit/detectors/host/host_only.py).

`lens = torch.tensor([...]); n = max(lens.tolist())` in the step builds host data and reads it back on the
host: capture records no kernel for it, so it bakes nothing (what the host then does with `n` is judged where
it goes). The same tensor meeting a device tensor (`h * lens`), or sent with `.to(D)`, is a baked host value.
"""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, matmul_target, table, write_target

USES = {
    "host-only": "n = max(lens.tolist()) + int(lens.sum().item()) + int(lens.float().mean())",
    "device-op": "h = h * lens.float().mean()",
    "sent": "h = h + lens.to(self.x.device).float().mean()",
}


@pytest.mark.parametrize("use", sorted(USES))
def test_host_data_read_back_on_the_host_bakes_nothing(tmp_path, use):
    step = f"""        lens = torch.tensor(self.pending)  # SITE
        h = torch.tanh(self.x @ self.w)
        {USES[use]}
        self.out.copy_(h)
        return self.out"""
    tpl = matmul_target(step=step, init="        self.pending = [1, 2]",
                        prepare="        self.pending = [random.randrange(1, 50) for _ in range(1 + i % 3)]",
                        imports="import random")
    path, site = write_target(tmp_path / "host_only.py", tpl, seed=random.randrange(2**31), d=random.choice([4, 8, 16]))
    bad = blocking(path)
    hit = at(bad, "baked-host-value", site)
    if use == "host-only":
        assert not len(bad), table(bad)
    else:
        assert len(hit) == 1, table(bad)
