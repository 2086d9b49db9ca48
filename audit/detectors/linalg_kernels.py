"""host-sync in torch.linalg decompositions whose kernel checks its `info` result on the host itself.

`torch.linalg.cholesky` / `inv` / `solve` are composites: the `_ex` kernel, then `_linalg_check_errors`, a
dispatched op the tracer sees (host_sync.linalg_error_check). The eigen- and singular-value decompositions are
single kernels that run the same check inside (`_linalg_eigh`, `_linalg_svd`, `linalg_eig`; `linalg_pinv` runs
svd or eigh inside its own kernel), so nothing of the check reaches the dispatcher on any device. torch's docs
say each of them synchronizes: eigh, eigvalsh, eig, eigvals, svdvals, pinv, matrix_rank, and cond (and so
`svd` itself, `matrix_norm` / `norm` with ord 2, -2 or 'nuc', `svd_lowrank`, which run the same `_linalg_svd`).
They have no `_ex` form, so the rule is keyed by the ops themselves.
"""

from __future__ import annotations

from audit.detectors.host_sync import sync_op

_WHAT = {
    "aten._linalg_eigh": "eigh / eigvalsh",
    "aten.linalg_eigh": "eigh",
    "aten.linalg_eigvalsh": "eigvalsh",
    "aten.linalg_eig": "eig / eigvals (computed through the host on CUDA)",
    "aten.linalg_eigvals": "eigvals (computed through the host on CUDA)",
    "aten._linalg_svd": "svd / svdvals (also behind matrix_norm(ord=2, -2, 'nuc'), cond, matrix_rank)",
    "aten.linalg_svd": "svd",
    "aten.linalg_svdvals": "svdvals",
    "aten.linalg_pinv": "pinv (svd or eigh inside)",
    "aten.pinverse": "pinverse (svd inside)",
}
_FIX = ("No torch.linalg eigen/singular-value decomposition avoids the check: run it outside the step (refresh "
        "the factors every k steps, after replay), or use a fixed-iteration method on the device (power or "
        "subspace iteration with QR, Newton-Schulz for an inverse square root or a spectral norm).")


@sync_op(*_WHAT)
def decomposition_check(rec):
    """The kernel reads its convergence `info` back on the host: on a GPU the call waits for the device."""
    return (f"`{rec.op}` ({_WHAT[rec.op]}) checks its `info` result on the host inside the kernel: torch's docs say "
            "it synchronizes the device with the CPU, and it has no `_ex` form that skips the check", _FIX)
