"""One object the step changed, reached two ways: keep the sites that ran.

A dict a forward hook fills through its closure cell (`stats[id(mod)] = out.norm().item()`) and that the factory
also hung on the model (`net.stats = stats`) is one change seen under two owners: the closure's and the model
attribute's. Each owner's own source search finds a site: the hook's store, which ran in the step, and the
factory's `net.stats = stats`, which did not (make() runs before the steps). When some owner's site ran, the
sites of the other owners that did not run are the same change seen from a line nobody has to touch. Only a
container (a dict, a list, an object: a snapshot form, not a bare number or string) can be one object under two
owners; two counters that both went from 2 to 3 are two changes.
"""

from __future__ import annotations

from collections import defaultdict

from audit.detectors.state import library_callers
from audit.detectors.state.sites import state_fps

__all__ = ["keep_ran", "shared_key"]


def keep_ran(ctx, entries: list) -> list:
    """entries: (object fingerprint, owner, site (file, line, function), step, finding). The findings, less those
    whose site did not run in its step while another owner's site of the same object did."""
    ran, executed = {}, {}
    for fps, owner, site, step, _ in entries:
        if fps is not None:
            if step not in executed:
                executed[step] = library_callers.executed(ctx, step)
            ran[(owner, site)] = (site[0], site[2]) in executed[step]
    owners_ran = defaultdict(set)
    for fps, owner, site, _, _ in entries:
        if ran.get((owner, site)):
            owners_ran[fps].add(owner)
    return [f for fps, owner, site, _, f in entries
            if fps is None or ran[(owner, site)] or not (owners_ran[fps] - {owner})]


def shared_key(change):
    """The key two owners of one container share (its before and after), or None for a bare value."""
    return state_fps(change) if isinstance(change.after, tuple) else None
