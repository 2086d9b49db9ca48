"""The module each thread is inside, for the records it makes.

A step that hands work to a thread (a grammar matcher filling a token bitmask in a ThreadPoolExecutor while the
forward runs) has that thread's ops recorded beside the step's own. torch's global module hooks fire on
whichever thread calls a module, so one shared stack would tag the worker's ops with the module the step's thread
happens to be inside at that moment (`model.emb` one step, `model.head` the next): the same call would look like
another call each step, a false data-dependent-control. Each thread keeps its own stack."""

from __future__ import annotations

import threading


class ModuleStacks:
    def __init__(self) -> None:
        self._by_thread: dict[int, list] = {}

    def push(self, name: str) -> None:
        self._by_thread.setdefault(threading.get_ident(), []).append(name)

    def pop(self) -> None:
        if mods := self._by_thread.get(threading.get_ident()):
            mods.pop()

    def top(self) -> str:
        """The innermost module the calling thread is inside, or "" outside any."""
        mods = self._by_thread.get(threading.get_ident())
        return mods[-1] if mods else ""
