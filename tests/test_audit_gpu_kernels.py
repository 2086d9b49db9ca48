"""host-sync inside the kernel a GPU runs for a custom op whose CPU kernel the CPU scan ran instead.

A custom op with a device-generic body and a `register_kernel("cpu")` reference, one made for the CPU with a
`register_kernel("cuda")`, or a `Library` with a "CPU" and a "CUDA" impl: the CPU scan runs the CPU kernel only,
yet the GPU kernel is what a captured step runs. A read back there (`int(k.item())` sizing a `topk`) is reported at
its line, with the step's call of the op as caller; a GPU kernel that stays on the device has nothing to report.
"""

from __future__ import annotations

import random

from site_util import blocking, table, write_target

CUSTOM_OP = """
import torch

NS = "gk{tag}"


@torch.library.custom_op(NS + "::keep_top", mutates_args=("out",){devices})
def keep_top(x: torch.Tensor, k: torch.Tensor, out: torch.Tensor) -> None:
{first_body}


@keep_top.register_kernel("{other}")
def _(x, k, out):
{second_body}
"""

GPU_READS = """    kk = int(k.item())  # SITE
    vals, idx = x.topk(kk, -1)
    out.zero_().scatter_(-1, idx, vals)"""
GPU_STAYS = """    ranks = x.argsort(-1, descending=True).argsort(-1)  # SITE
    out.copy_(torch.where(ranks < k, x, torch.zeros_like(x)))"""
CPU_REF = """    ranks = x.argsort(-1, descending=True).argsort(-1)
    out.copy_(torch.where(ranks < k, x, torch.zeros_like(x)))"""

LIBRARY = """
import torch

_lib = torch.library.Library("gk{tag}", "DEF")
_lib.define("keep_top(Tensor x, Tensor k, Tensor(a!) out) -> ()")


def keep_top_cpu(x, k, out):
    ranks = x.argsort(-1, descending=True).argsort(-1)
    out.copy_(torch.where(ranks < k, x, torch.zeros_like(x)))


def keep_top_cuda(x, k, out):
{gpu}


_lib.impl("keep_top", keep_top_cpu, "CPU")
_lib.impl("keep_top", keep_top_cuda, "CUDA")
"""

STEP = """

class Target:
    def __init__(self, device):
        torch.manual_seed({seed})
        self.x = torch.zeros({t}, {v}, device=device)
        self.k = torch.full((), {k}, dtype=torch.long, device=device)
        self.out = torch.empty({t}, {v}, device=device)

    def prepare(self, i):
        self.x.copy_(torch.randn({t}, {v}))

    @torch.no_grad()
    def step(self):
        getattr(torch.ops, "gk{tag}").keep_top(self.x, self.k, self.out)
        return self.out


def make(device):
    return Target(device)
"""


HOST_ARG = STEP.replace("self.k = torch.full((), {k}, dtype=torch.long, device=device)",
                        "self.k = torch.tensor({k})  # kept on the host, beside the device tensors")


def _fields():
    return dict(tag=random.randrange(10**9), seed=random.randrange(10**6), t=random.choice([2, 4]),
                v=random.choice([16, 32]), k=random.choice([3, 5]))


def _custom_op(tmp_path, name, gpu, cuda_registered, step=STEP):
    """A custom op whose GPU kernel is `gpu`: the generic body beside a CPU kernel, or a CUDA kernel beside a body
    made for the CPU."""
    if cuda_registered:
        parts = dict(devices=', device_types="cpu"', first_body=CPU_REF, other="cuda", second_body=gpu)
    else:
        parts = dict(devices="", first_body=gpu, other="cpu", second_body=CPU_REF)
    template = (CUSTOM_OP + step).replace("{first_body}", parts["first_body"]).replace(
        "{second_body}", parts["second_body"])
    return write_target(tmp_path / name, template, devices=parts["devices"], other=parts["other"], **_fields())


def _syncs(bad, line):
    return ((bad.line == line) & (bad.category == "host-sync")).any()


def test_a_read_in_the_generic_body_beside_a_cpu_kernel_is_a_host_sync(tmp_path):
    path, site = _custom_op(tmp_path, "gk_generic.py", GPU_READS, cuda_registered=False)
    bad = blocking(path)
    assert _syncs(bad, site), table(bad)


def test_a_read_in_a_registered_cuda_kernel_is_a_host_sync(tmp_path):
    path, site = _custom_op(tmp_path, "gk_cuda.py", GPU_READS, cuda_registered=True)
    bad = blocking(path)
    assert _syncs(bad, site), table(bad)


def test_a_read_in_a_library_cuda_impl_is_a_host_sync(tmp_path):
    template = (LIBRARY + STEP).replace("{gpu}", GPU_READS)
    path, site = write_target(tmp_path / "gk_library.py", template, **_fields())
    bad = blocking(path)
    assert _syncs(bad, site), table(bad)


def test_a_gpu_kernel_that_stays_on_the_device_has_nothing(tmp_path):
    for cuda_registered in (False, True):
        path, _ = _custom_op(tmp_path, f"gk_clean_{cuda_registered}.py", GPU_STAYS, cuda_registered)
        bad = blocking(path)
        assert bad.empty, table(bad)


def test_a_read_of_an_argument_kept_on_the_host_waits_for_nothing(tmp_path):
    path, site = _custom_op(tmp_path, "gk_host_arg.py", GPU_READS, cuda_registered=True, step=HOST_ARG)
    bad = blocking(path)
    assert not _syncs(bad, site), table(bad)
