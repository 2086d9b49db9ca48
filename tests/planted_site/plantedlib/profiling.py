"""Region profiler: a @contextmanager that counts how often each named region ran. The hazard: the
count is taken in the generator before the `with` body, so no torch op of the step runs inside this
function; the site is its statement, the caller the target's `with` line."""

from contextlib import contextmanager

REGION_COUNTS: dict = {}


@contextmanager
def region(name: str, enabled: bool = True):
    if enabled:
        REGION_COUNTS[name] = REGION_COUNTS.get(name, 0) + 1  # HAZARD: cpu-side-effect
    yield
