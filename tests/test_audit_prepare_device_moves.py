"""stale-input-pointer for an input prepare() rebinds to a device copy of a host buffer the object keeps.

`self.idx = self.idx_cpu.to(self.device, non_blocking=True)` in prepare() makes a new device tensor per call on a
GPU, so a graph keeps reading the capture step's copy; on a CPU scan the move returns the host buffer itself and
the step reads one storage every step. The source says it: the finding is at the step's first read. Uploading
into a static device buffer (`self.idx.copy_(self.idx_cpu, non_blocking=True)`), or moving a tensor the class
already makes on the device, is no finding."""

from __future__ import annotations

import random

import pytest

from site_util import blocking, table, write_target

TEMPLATE = """
import torch


class Runner:
    def __init__(self, device):
        g = torch.Generator().manual_seed({seed})
        self.device = torch.device(device)
        self.w = torch.randn({v}, {d}, generator=g, device=device)
        self.{name}_cpu = {host}
        self.{name} = torch.zeros({n}, dtype=torch.long, device=device)
        self.out = torch.zeros({n}, {d}, device=device)

    def {helper}(self):
        {upload}

    def prepare(self, i):
        self.{name}_cpu.copy_(torch.randint(0, {v}, ({n},)))
        self.{helper}()

    @torch.no_grad()
    def step(self):
        h = self.w[self.{name}]  # SITE
        self.out.copy_(torch.tanh(h))
        return self.out


def make(device):
    return Runner(device)
"""

UPLOADS = {
    "rebound": "self.{name} = self.{name}_cpu.to(self.device, non_blocking=True)",
    "rebound_cuda": "self.{name} = self.{name}_cpu[:].cuda() if self.device.type == 'cuda' else self.{name}_cpu",
    "copied": "self.{name}.copy_(self.{name}_cpu, non_blocking=True)",
    "device_made": "self.{name} = self.{name}_dev.to(self.device)",
}


@pytest.mark.parametrize("kind", list(UPLOADS))
def test_an_input_rebound_to_a_device_copy_in_prepare(tmp_path, kind):
    name = random.choice(["slot_mapping", "ids", "positions", "block_ids"])
    n = random.choice([3, 4, 6])
    host = random.choice([f"torch.zeros({n}, dtype=torch.long)",
                          f"torch.zeros({n}, dtype=torch.long, pin_memory=torch.cuda.is_available())"])
    if kind == "device_made":
        host = f"torch.zeros({n}, dtype=torch.long)\n        self.{name}_dev = torch.zeros({n}, dtype=torch.long, device=device)"
        upload = UPLOADS[kind].format(name=name) + f"\n        self.{name}_dev.copy_(self.{name}_cpu)"
    else:
        upload = UPLOADS[kind].format(name=name)
    path, site = write_target(
        tmp_path / f"moved_{kind}_{random.randrange(10**6)}.py", TEMPLATE, seed=random.randrange(1000),
        name=name, n=n, d=random.choice([8, 12]), v=random.choice([16, 32]), host=host, upload=upload,
        helper=random.choice(["_upload", "stage_inputs"]))
    bad = blocking(path)
    if kind.startswith("rebound"):
        hit = bad[bad.category == "stale-input-pointer"]
        assert len(hit) == 1 and int(hit.iloc[0].line) == site, table(bad)
        assert name in hit.iloc[0].message, table(bad)
        assert set(bad.category) == {"stale-input-pointer"}, table(bad)
    else:
        assert not len(bad), table(bad)


BUILDER = """
import torch


class {builder}:
    def __init__(self, n, device):
        self.device = torch.device(device)
        self.{name}_cpu = torch.zeros(n, dtype=torch.long)

    def {stage}(self, values):
        self.{name}_cpu.copy_(values)
        self.{name} = self.{name}_cpu.to(self.device, non_blocking=True)


class Runner:
    def __init__(self, device):
        g = torch.Generator().manual_seed({seed})
        self.w = torch.randn({v}, {d}, generator=g, device=device)
        self.meta = {builder}({n}, device)
        self.out = torch.zeros({n}, {d}, device=device)

    def prepare(self, i):
        {when}self.meta.{stage}(torch.randint(0, {v}, ({n},)))

    @torch.no_grad()
    def step(self):
        h = self.w[self.meta.{name}]  # SITE
        self.out.copy_(torch.tanh(h))
        return self.out


def make(device):
    return Runner(device)
"""


@pytest.mark.parametrize("kind", ["every_step", "first_step_only"])
def test_a_builder_object_rebinding_its_fields_to_device_copies(tmp_path, kind):
    """The upload sits in a method of an object the target holds (a metadata builder); done on every step it
    is stale on a GPU, done once under `if i == 0:` it makes one tensor before any capture."""
    name = random.choice(["slot_mapping", "seq_lens", "query_start_loc"])
    path, site = write_target(
        tmp_path / f"builder_{kind}_{random.randrange(10**6)}.py", BUILDER, seed=random.randrange(1000),
        builder=random.choice(["MetadataBuilder", "AttnMetaBuilder"]), stage=random.choice(["stage", "build"]),
        name=name, n=random.choice([3, 4, 6]), d=random.choice([8, 12]), v=random.choice([16, 32]),
        when="" if kind == "every_step" else "if i == 0:\n            ")
    bad = blocking(path)
    if kind == "every_step":
        hit = bad[bad.category == "stale-input-pointer"]
        assert len(hit) == 1 and int(hit.iloc[0].line) == site and f"meta.{name}" in hit.iloc[0].message, table(bad)
        assert set(bad.category) == {"stale-input-pointer"}, table(bad)
    else:
        assert not len(bad), table(bad)


KEYED = """
import torch

NAMES = ("{a}", "{b}")


class Runner:
    def __init__(self, device):
        g = torch.Generator().manual_seed({seed})
        self.device = torch.device(device)
        self.w = torch.randn({v}, {d}, generator=g, device=device)
        self.{host} = {{name: torch.zeros({n}, dtype=torch.long) for name in NAMES}}
        self.{dev} = {{name: torch.zeros({n}, dtype=torch.long, device=device) for name in NAMES}}
        self.out = torch.zeros({n}, {d}, device=device)

    def prepare(self, i):
        for name in NAMES:
            self.{host}[name].copy_(torch.randint(0, {v}, ({n},)))
            {upload}

    @torch.no_grad()
    def step(self):
        h = self.w[self.{dev}["{a}"]]  # SITE
        h = h + self.w[self.{dev}["{b}"]]  # SECOND
        self.out.copy_(torch.tanh(h))
        return self.out


def make(device):
    return Runner(device)
"""


@pytest.mark.parametrize("kind", ["rebound", "copied"])
def test_dict_entries_rebound_to_device_copies_of_host_entries(tmp_path, kind):
    """Host staging buffers kept in a dict by name, uploaded by rebinding the device dict's entries
    (`self.inputs[name] = self.cpu_bufs[name].to(D)`): each entry the step reads is reported at its first read."""
    host, dev = random.choice([("cpu_bufs", "inputs"), ("staging", "device_bufs")])
    a, b = random.sample(["input_ids", "slot_mapping", "positions"], 2)
    upload = (f"self.{dev}[name] = self.{host}[name].to(self.device, non_blocking=True)" if kind == "rebound"
              else f"self.{dev}[name].copy_(self.{host}[name], non_blocking=True)")
    path, site = write_target(
        tmp_path / f"keyed_{kind}_{random.randrange(10**6)}.py", KEYED, seed=random.randrange(1000), host=host,
        dev=dev, a=a, b=b, n=random.choice([3, 4, 6]), d=random.choice([8, 12]), v=random.choice([16, 32]),
        upload=upload)
    bad = blocking(path)
    if kind == "rebound":
        assert sorted(int(x) for x in bad.line) == [site, site + 1], table(bad)
        assert set(bad.category) == {"stale-input-pointer"}, table(bad)
    else:
        assert not len(bad), table(bad)


FIELDS = """
import dataclasses

import torch


@dataclasses.dataclass(frozen=True)
class {meta}:
    {field}: torch.Tensor
    n: int = 0


class Runner:
    def __init__(self, device):
        g = torch.Generator().manual_seed({seed})
        self.device = torch.device(device)
        self.w = torch.randn({v}, {d}, generator=g, device=device)
        self.{field}_cpu = torch.zeros({n}, dtype=torch.long)
        self.meta = {meta}(torch.zeros({n}, dtype=torch.long, device=device))
        self.out = torch.zeros({n}, {d}, device=device)

    def prepare(self, i):
        self.{field}_cpu.copy_(torch.randint(0, {v}, ({n},)))
        {upload}

    @torch.no_grad()
    def step(self):
        h = self.w[self.meta.{field}]  # SITE
        self.out.copy_(torch.tanh(h))
        return self.out


def make(device):
    return Runner(device)
"""


@pytest.mark.parametrize("kind", ["replaced", "built", "copied"])
def test_a_metadata_field_given_a_device_copy_by_keyword(tmp_path, kind):
    """The move is a keyword of the call that makes the stored object (`dataclasses.replace(self.meta, f=...)`, or
    the dataclass itself): the field is the rebound input. Refilling the field's static buffer is no finding."""
    meta, field = random.choice(["DecodeMeta", "AttnMetadata"]), random.choice(["seq_lens", "slot_mapping"])
    move = f"self.{field}_cpu.to(self.device, non_blocking=True)"
    upload = {"replaced": f"self.meta = dataclasses.replace(self.meta, {field}={move}, n=i)",
              "built": f"self.meta = {meta}({field}={move}, n=i)",
              "copied": f"self.meta.{field}.copy_(self.{field}_cpu, non_blocking=True)"}[kind]
    path, site = write_target(
        tmp_path / f"fields_{kind}_{random.randrange(10**6)}.py", FIELDS, seed=random.randrange(1000), meta=meta,
        field=field, n=random.choice([3, 4, 6]), d=random.choice([8, 12]), v=random.choice([16, 32]), upload=upload)
    bad = blocking(path)
    if kind != "copied":
        hit = bad[bad.category == "stale-input-pointer"]
        assert len(hit) == 1 and int(hit.iloc[0].line) == site and f"meta.{field}" in hit.iloc[0].message, table(bad)
        assert set(bad.category) == {"stale-input-pointer"}, table(bad)
    else:
        assert not len(bad), table(bad)
