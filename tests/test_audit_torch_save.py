"""`torch.save` in the step copies every device storage it serializes to the host (`storage.cpu()`,
not dispatched, so no aten op shows it) and waits for the device: a host-sync at the saving line,
also through an alias bound at import (`from torch import save`) and for tensors inside a dict. Saving
plain Python data is no device read. Saving a tensor that lives in host memory on a GPU too (a counter the
target keeps on the CPU, a table built from host data in the step) waits for nothing, but the write is
host work a replay skips: a cpu-side-effect, not a host-sync.
Pickling a tensor (`pickle.dumps(t)`, a payload for another process)
saves its storage the same way; `copy.copy(t)` reduces it without saving the storage.
"""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, matmul_target, table, write_target

FORMS = {
    "tensor": "torch.save(h, self.buf)",
    "dict": "torch.save({'h': h, 'step': 1}, self.buf)",
    "alias": "tsave([h], self.buf)",
    "serialization": "torch.serialization.save(h, self.buf)",
}

TARGET = matmul_target(
    imports="import copy\nimport io\nimport pickle\nfrom torch import save as tsave",
    init="        self.buf = io.BytesIO()\n        self.count_cpu = torch.zeros((), dtype=torch.long, device=\"cpu\")",
    prepare="        self.buf.seek(0)",
    step="        h = torch.tanh(self.x @ self.w)\n        {line}  # SITE\n        self.out.copy_(h)\n        return self.out")


def _write(tmp_path, line: str):
    seed, d = random.randrange(2**31), random.choice([4, 8, 16])
    return write_target(tmp_path / "save_target.py", TARGET, seed=seed, d=d, line=line)


@pytest.mark.parametrize("form", sorted(FORMS))
def test_torch_save_of_a_step_tensor_is_a_host_sync(tmp_path, form):
    path, site = _write(tmp_path, FORMS[form])
    bad = blocking(path)
    hit = at(bad, "host-sync", site)
    assert len(hit) == 1, table(bad)
    assert "torch.save" in hit.iloc[0].op


def test_saving_plain_data_is_clean(tmp_path):
    path, _ = _write(tmp_path, "torch.save({'step': 1, 'names': ['a']}, self.buf)")
    bad = blocking(path)
    assert bad.empty, table(bad)


@pytest.mark.parametrize("line", ["torch.save(self.count_cpu, self.buf)", "torch.save(torch.tensor([1, 2, 3]), self.buf)"])
def test_saving_a_host_tensor_is_a_side_effect_not_a_sync(tmp_path, line):
    path, site = _write(tmp_path, line)
    bad = blocking(path)
    assert at(bad, "host-sync", site).empty, table(bad)
    hit = at(bad, "cpu-side-effect", site)
    assert len(hit) == 1 and "torch.save" in hit.iloc[0].op, table(bad)


@pytest.mark.parametrize("line", ["pickle.dumps(h)", "pickle.dumps({'tok': h, 'step': 1})"])
def test_pickling_a_step_tensor_is_a_host_sync(tmp_path, line):
    path, site = _write(tmp_path, f"self.payload = {line}")
    bad = blocking(path)
    hit = at(bad, "host-sync", site)
    assert len(hit) == 1 and hit.iloc[0].op == "pickle", table(bad)


@pytest.mark.parametrize("line", ["copy.copy(h).add_(0)", "pickle.dumps([1, 2, 3])"])
def test_copying_a_tensor_or_pickling_plain_data_is_clean(tmp_path, line):
    path, _ = _write(tmp_path, f"self.payload = {line}")
    bad = blocking(path)
    assert bad[bad.category == "host-sync"].empty, table(bad)
