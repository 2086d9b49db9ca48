"""An offload hook's host-kept weights moved to the device at every forward: pageable-copy on a CPU scan.

An accelerate-style helper keeps a module's weights on the host (`{n: p.detach().to("cpu")}`, a list of
`.cpu()` copies, one attribute) in a hook object, and a forward pre-hook moves them to the execution device
per call. On a GPU that is a copy from pageable memory, which capture refuses; on a CPU scan both moves are
no-ops, so the source says where the tensors live, also through a helper returning them and the mapping
object they are passed to (accelerate's `weights_map`). Weights kept as they are (on the device) and moved with
`.to(device)`, or pinned copies uploaded into device buffers made once, stay clean.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, install_library, library_hit, module_target, table, write_target

LIB = """
import torch


class Loader:
    def __init__(self, state_dict):
        self.state_dict = state_dict

    def __getitem__(self, key):
        return self.state_dict[key]


def host_copy(module):
    return {k: v.detach().cpu() for k, v in module.named_parameters(recurse=False)}


def same_copy(module):
    return {k: v.detach() for k, v in module.named_parameters(recurse=False)}


class Offload:
    def __init__(self, module, device):
        self.device = torch.device(device)
        self.names = [n for n, _ in module.named_parameters(recurse=False)]
        {keep}
        for n in self.names:
            delattr(module, n)
            setattr(module, n, None)

    def pre(self, module, args):
        for i, n in enumerate(self.names):
            {move}
        return None


def offload(module, device):
    hook = Offload(module, device)
    module.register_forward_pre_hook(hook.pre)
    return hook
"""

KINDS = {
    "dict_to_cpu": ('self.host = {{n: p.detach().to("cpu") for n, p in module.named_parameters(recurse=False)}}',
                    "setattr(module, n, self.host[n].to(self.device))  # LIBSITE"),
    "list_cpu": ("self.host = [p.detach().cpu() for _, p in module.named_parameters(recurse=False)]",
                 "setattr(module, n, self.host[i].to(self.device))  # LIBSITE"),
    "weights_map": ("self.host = Loader(host_copy(module))", "setattr(module, n, self.host[n].to(self.device))  # LIBSITE"),
    "weights_map_on_device": ("self.host = Loader(same_copy(module))",
                              "setattr(module, n, self.host[n].to(self.device))  # LIBSITE"),
    "kept_on_device": ("self.host = {{n: p.detach() for n, p in module.named_parameters(recurse=False)}}",
                       "setattr(module, n, self.host[n].to(self.device))  # LIBSITE"),
    "pinned_upload": ("self.host = [p.detach().cpu().pin_memory() for _, p in module.named_parameters(recurse=False)]"
                      "\n        self.dev = [torch.empty_like(p.detach()) for _, p in module.named_parameters(recurse=False)]",
                      "self.dev[i].copy_(self.host[i], non_blocking=True); setattr(module, n, self.dev[i])  # LIBSITE"),
}

TARGET = module_target(imports="from {mod} import offload", init="""\
        self.lin = nn.Linear({d}, {d})
        self.hook = offload(self.lin, "cpu")""", step="""\
        h = self.lin(self.x)  # SITE
        self.out.copy_(h)
        return self.out""")


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_an_offload_hooks_host_weights_moved_per_forward(tmp_path, monkeypatch, kind):
    keep, move = KINDS[kind]
    mod, lib = install_library(tmp_path, monkeypatch, LIB.replace("{keep}", keep.replace("{{", "{").replace("}}", "}"))
                               .replace("{move}", move), "offload_lib")
    path, site = write_target(tmp_path / "target" / "offload_target.py", TARGET, mod=mod,
                              seed=random.randrange(2**31), d=random.choice([4, 8, 16]))
    bad = blocking(path, forget=mod)
    if kind in ("kept_on_device", "pinned_upload", "weights_map_on_device"):
        assert not len(bad), table(bad)
        return
    library_hit(bad, "pageable-copy", lib, path, site)
