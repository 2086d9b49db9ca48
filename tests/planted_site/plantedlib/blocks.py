"""Prefix-cache bookkeeping: blocks kept in LRU order (an OrderedDict). The hazard: `touch()` runs no
torch op, so no record of the step passes through it, yet its statement is the site."""

from collections import OrderedDict


class BlockLRU:
    def __init__(self, n_blocks: int):
        self.order = OrderedDict((b, None) for b in range(n_blocks))

    def touch(self, block_ids) -> None:
        for b in block_ids:
            self.order.move_to_end(b)  # HAZARD: cpu-side-effect

    def evict(self) -> int:
        b, _ = self.order.popitem(last=False)
        self.order[b] = None
        return b
