"""host-sync: `torch._grouped_mm` (MoE experts as one grouped GEMM) outside its fast path.

On a GPU the op runs one CUTLASS kernel only for bf16 operands on sm90/sm100 devices (H100, H200, B200). Any
other dtype or GPU takes torch's fallback, which copies the group offsets `offs` to the host and loops over
the groups: a device->host read that waits for the device, and capture refuses it. (transformers' default
"grouped_mm" experts call it for every MoE model.) Without `offs` (3-d by 3-d) the fallback is a bmm: no read.
"""

from __future__ import annotations

import torch

from audit.detectors.host_sync import sync_op

_FAST = {torch.bfloat16}
_FAST_ARCHS = (9, 10)


def _fast_device(dev: torch.device) -> bool:
    """A CUDA scan knows the GPU; a CPU scan does not, and takes the fast path's GPUs as the deployment."""
    if dev.type != "cuda":
        return True
    try:
        return torch.cuda.get_device_capability(dev)[0] in _FAST_ARCHS
    except Exception:  # noqa: BLE001 - the device went away: judge by dtype alone
        return True


@sync_op("aten._grouped_mm")
def grouped_mm_fallback(rec):
    """Grouped by `offs`, with operands other than bf16 (or on a GPU without the fast kernels)."""
    mats, offs = rec.inputs[:2], rec.inputs[2:3]
    if len(mats) < 2 or not offs or offs[0].dtype not in (torch.int32, torch.int64):
        return None
    if all(m.dtype in _FAST for m in mats) and _fast_device(mats[0].device):
        return None
    dtypes = "/".join(sorted({str(m.dtype).replace("torch.", "") for m in mats}))
    return (f"`torch._grouped_mm` on {dtypes} operands takes torch's fallback on a GPU (its fast kernel needs bf16 "
            "on sm90/sm100), which copies the group offsets to the host and waits for the device",
            "Run the grouped GEMM in bf16 on an H100/H200/B200 class GPU, or use per-expert GEMMs over a fixed "
            "capacity (a padded [E, C, d] batch with a bmm) that need no offsets on the host.")
