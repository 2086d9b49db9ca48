"""A container slot that every step rebinds to the tensor it made: no Python state a replay would miss.

A TorchRL-style module writes its output into a tensordict the target keeps (`td["logits"] = out`), a wrapper
keeps its last result in a dict (`self.last["obs"] = obs`): each step the slot gives up the tensor the previous
step made and takes the one this step made. Under capture the slot takes the graph's output tensor once, and
every replay rewrites that tensor, so after a replay the slot holds this replay's value, as after an eager
step. That is the same as a top-level attribute rebound to a tensor the step made, which is left to the tensor
detectors: when a later step reads the tensor, step-allocation reports it as escaping; when none does, it is no
hazard. A container whose members shift (a full deque appended to) keeps tensors made steps ago at new positions:
that is state a replay would not move, and stays a cpu-side-effect.
"""

from __future__ import annotations

from audit.detectors.allocation import tensor_storages


def rewritten_each_step(ctx, hits) -> bool:
    """Whether the changes `hits` ([(step, StateChange)] of one owner and attribute) only rebind container slots
    to tensors made in that step, each in place of a tensor the step before made (checked on the steps after
    the first audited one, whose predecessor the scan did not trace)."""
    born, checked = ctx.trace.born, False
    for s, c in hits:
        if not c.tensor_members_only:
            return False
        if s == 0:
            continue
        before, after = tensor_storages(c.before, set()), tensor_storages(c.after, set())
        new, gone = after - before, before - after
        if not new or any(born.get(sid, (None,))[0] != s for sid in new) or \
                any(born.get(sid, (None,))[0] != s - 1 for sid in gone):
            return False
        checked = True
    return checked
