"""Host reads that torch's own Python code makes for the line that called it.

The line a finding names may show no read at all: `torch.distributions.Categorical(logits=scores)` checks its
arguments on the host by default (`validate_args`), `if tok in ids:` runs `Tensor.__contains__`. The message says
which torch function read the tensor back, and where torch offers a switch, the fix names it.
"""

from __future__ import annotations

__all__ = ["explain"]

# torch code whose host reads a switch turns off, by the folder or file they come from
_SWITCHES = {
    "torch/distributions/": (
        "torch.distributions checks a distribution's arguments (and each sample given to log_prob) on the host "
        "by default: construct it with validate_args=False, or call "
        "torch.distributions.Distribution.set_default_validate_args(False) once outside the step."),
}


def explain(r, msg: str, fix: str) -> tuple[str, str]:
    """(message, fix) for host read `r`, naming the torch functions that made the read, if torch made it."""
    if not getattr(r, "inside", ""):
        return msg, fix
    switch = next((f for where, f in _SWITCHES.items() if where in r.inside), None)
    return f"{msg}, inside torch: {r.inside}", switch or fix
