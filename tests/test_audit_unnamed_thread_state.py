"""A feeder that runs ahead on its own thread (torchdata's Prefetcher, a background batch producer) and is taken
from only in prepare(): while the step runs, the thread keeps filling its queue, and the methods that change that
queue include prepare()'s `take()`, which no thread runs, so the thread rules did not excuse it. The step's code
names nothing on the path to that queue: it cannot have changed it. A step that takes from the feeder itself is
still a cpu-side-effect."""

from __future__ import annotations

import random

from site_util import FED_STEP, blocking, table, write_target

TARGET = """
import queue
import threading
import time

import torch


class Feeder:
    def __init__(self, d):
        self.d = d
        self._{q} = queue.Queue(maxsize={depth})
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._produce, daemon=True)
        self._t.start()

    def _produce(self):
        while not self._stop.is_set():
            try:
                self._push([float(j) for j in range(self.d)])
            except queue.Full:
                time.sleep(0.0005)

    def _push(self, row):
        self._{q}.put(row, timeout=0.001)

    def take(self):
        return self._{q}.get()


class Target:
    def __init__(self, device):
        g = torch.Generator().manual_seed({seed})
        self.w = torch.randn({d}, {d}, generator=g, device=device)
        self.{feeder} = Feeder({d})
        self.x = torch.zeros(1, {d}, device=device)
        self.out = torch.zeros(1, {d}, device=device)
""" + FED_STEP


def _target(tmp_path, take: str, prepare: str):
    feeder = random.choice(["feeder", "batches", "src"])
    return write_target(tmp_path / f"unnamed_{random.randrange(10**9)}.py", TARGET, feeder=feeder,
                        take=take.format(feeder=feeder), prepare=prepare.format(feeder=feeder),
                        q=random.choice(["q", "ready", "buf"]), depth=random.choice([2, 4]),
                        seed=random.randrange(2**31), d=random.choice([4, 8]))


def test_a_feeder_filled_by_its_thread_and_taken_from_in_prepare_is_no_side_effect(tmp_path):
    for _ in range(2):  # the thread's timing differs from run to run
        path, _ = _target(tmp_path, "pass", "self.x.copy_(torch.tensor([self.{feeder}.take()]))")
        bad = blocking(path)
        assert not len(bad[bad.category == "cpu-side-effect"]), table(bad)


def test_a_step_that_takes_from_the_feeder_is_a_side_effect(tmp_path):
    path, _ = _target(tmp_path, "row = self.{feeder}.take()", "pass")
    bad = blocking(path)
    assert len(bad[bad.category == "cpu-side-effect"]), table(bad)


HOOKED = TARGET.replace('''        self.{feeder} = Feeder({d})
''', '''        self.{feeder} = Feeder({d})
        self.tally = Tally()
        self.lin = torch.nn.Linear({d}, {d}).to(device)
        self.lin.register_forward_hook(self.tally.{hook})
''').replace('''class Target:''', '''class Tally:
    def __init__(self):
        self.seen = 0

    def {hook}(self, module, args, out):
        self.seen += 1  # HOOKSITE


class Target:''')


def test_a_hook_torch_runs_still_changes_state_the_step_never_names(tmp_path):
    """A forward hook is called by torch, not by a name the step's code uses: while the feeder's thread runs,
    the counter the hook bumps under `self.tally` is still the step's."""
    hook = random.choice(["count", "on_forward", "note"])
    path, _ = write_target(tmp_path / f"hooked_{random.randrange(10**9)}.py", HOOKED, feeder="feeder", hook=hook,
                           take="self.x.copy_(self.lin(self.x))", prepare="pass", q="q", depth=2,
                           seed=random.randrange(2**31), d=random.choice([4, 8]))
    bad = blocking(path)
    line = next(n for n, t in enumerate(path.read_text().splitlines(), 1) if "# HOOKSITE" in t)
    assert len(bad[(bad.category == "cpu-side-effect") & (bad.line == line)]), table(bad)


BYSTANDER = """
import threading
import time

import torch


def _idle(stop):
    while not stop.is_set():
        time.sleep(0.001)


class Tally:
    def __init__(self):
        self.seen = 0

    def {hook}(self, h):
        self.seen += 1  # HOOKSITE
        return h


class Layer:
    def __init__(self, post):
        self.post = post

    def __call__(self, h):
        return self.post(torch.tanh(h))


class Target:
    def __init__(self, device):
        self.stop = threading.Event()
        threading.Thread(target=_idle, args=(self.stop,), daemon=True).start()
        self.tally = Tally()
        self.layer = Layer(self.tally.{hook})
        self.x = torch.randn(1, {d}, device=device)
        self.out = torch.zeros(1, {d}, device=device)

    def prepare(self, i):
        pass

    @torch.no_grad()
    def step(self):
        self.out.copy_(self.layer(self.x))
        return self.out


def make(device):
    return Target(device)
"""


def test_a_thread_that_holds_nothing_of_the_target_excuses_nothing(tmp_path):
    """A bystander thread (a test runner's, a progress bar's) holds none of the target: a counter the step bumps
    through a callable a helper object keeps under another name is still the step's."""
    path, _ = write_target(tmp_path / f"bystander_{random.randrange(10**9)}.py", BYSTANDER, marker="# HOOKSITE",
                           hook=random.choice(["on_h", "count", "note"]), d=random.choice([4, 8]))
    bad = blocking(path)
    line = next(n for n, t in enumerate(path.read_text().splitlines(), 1) if "# HOOKSITE" in t)
    assert len(bad[(bad.category == "cpu-side-effect") & (bad.line == line)]), table(bad)
