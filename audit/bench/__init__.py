"""Stage 5 (CUDA for graph rows): eager vs graph vs torch.compile decode, profiles, report and plot.

`run` builds the model and iterates rows, `modes` builds and times one row, `profile` splits GPU
time by kernel family and layer, `result` holds the rows, `report` and `plot` write them.
"""

from audit.bench.result import BenchResult, ModeResult
from audit.bench.run import bench

__all__ = ["BenchResult", "ModeResult", "bench"]
