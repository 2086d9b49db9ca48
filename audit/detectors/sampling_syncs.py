"""host-sync: samplers whose aten op reads the device before it draws (registered into host_sync's SYNC_OPS).

`torch.multinomial` (and what calls it: `Categorical.sample`, `torch.distributions.OneHotCategorical`) looks
like one kernel, but without replacement, or when it draws a single sample, torch's Distributions.cpp first
checks its input on the host: `((p.max() < inf) & (p.min() >= 0)).item()` and whether any row sums to zero,
another `.item()`. On a CPU scan those reads happen inside the CPU kernel, below the dispatcher, so the op
itself is the signal. Under capture the read is an illegal synchronization; in eager decode it stalls every
sampled token (gpt-fast's `multinomial_sample_one_no_sync` exists for this reason). With replacement and
several samples the CUDA path only asserts in the kernel.
"""

from __future__ import annotations

from audit.detectors.host_sync import sync_op

__all__ = ["multinomial_checks"]


def _kw(rec) -> dict:
    return dict(a for a in rec.args if isinstance(a, tuple) and len(a) == 2 and isinstance(a[0], str))


@sync_op("aten.multinomial")
def multinomial_checks(rec):
    """multinomial(p, n, replacement) with replacement=False or n == 1 reads p's max/min/row sums back."""
    pos = [a for a in rec.args if not (isinstance(a, tuple) and len(a) == 2 and isinstance(a[0], str))]
    n = next((a for a in pos if isinstance(a, int) and not isinstance(a, bool)), _kw(rec).get("num_samples", 1))
    replacement = _kw(rec).get("replacement", next((a for a in pos if isinstance(a, bool)), False))
    if replacement and n != 1:
        return None
    return ("`torch.multinomial` validates its probabilities on the host first (max, min and row sums read back "
            "with `.item()`), so it waits for the device",
            "Draw on the device with no check: `(probs / torch.empty_like(probs).exponential_(1)).argmax(-1)` "
            "(or Gumbel-max on the logits).")
