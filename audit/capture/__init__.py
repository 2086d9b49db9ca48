"""Stage 4 (CUDA): trial captures in disposable workers, graph nodes against eager kernels, bisection.

`trial` captures one callable and replays it against eager; `graph` counts kernel nodes; `state`
snapshots and compares what a step changed; `record` and `modules` find and call module methods;
`worker` and `pool` run captures in subprocesses that are replaced after a failure (one invalid
capture poisons a process); `bisect` walks layers down to the failing leaf; `view` prints it.
"""

from audit.capture.bisect import BisectReport, Node, bisect, parse_layers
from audit.capture.trial import CaptureResult, capture_callable, trial_capture

__all__ = ["BisectReport", "CaptureResult", "Node", "bisect", "capture_callable", "parse_layers", "trial_capture"]
