"""What a bench run measured: one ModeResult per (mode, batch, context), gathered in a BenchResult."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from audit.errors import AuditError


@dataclass
class ModeResult:
    mode: str
    batch: int
    context: int
    steps: int = 0                  # timed steps behind the figures
    ms_median: float | None = None
    ms_p10: float | None = None
    ms_p90: float | None = None
    tokens_per_s: float | None = None
    bitwise_ok: bool | None = None
    fused: bool = False
    drift: float | None = None      # fused rows: max relative logit difference vs the unfused static path
    build_s: float | None = None    # decoder construction (compile + capture), or compile + warmup
    note: str = ""
    kernels: list[dict] = field(default_factory=list)  # full rows: the replay's GPU kernels by time
    per_layer: list[dict] = field(default_factory=list)  # full rows: each layer alone under a graph
    skip_reasons: list[str] = field(default_factory=list)
    copy_tb_s: float | None = None  # the copy ceiling measured by the run this row came from
    commit: str = ""                # the source tree measured (git HEAD, "+dirty" with local changes)


@dataclass
class BenchResult:
    preset: str
    device: str
    n_layers: int
    dtype: str
    steps: int
    copy_tb_s: float | None
    kernels: bool = False           # the weight-only decode kernels (dsv4/kernels) were on
    weight_bytes: dict = field(default_factory=dict)  # batch -> bytes read per decode step
    bytes_by_kind: dict = field(default_factory=dict)  # batch -> {fp8, bf16, experts, other} -> bytes
    warnings: list[str] = field(default_factory=list)  # library warnings raised during the run (not printed)
    rows: list[ModeResult] = field(default_factory=list)
    per_layer: list[dict] = field(default_factory=list)
    torch_version: str = torch.__version__

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> BenchResult:
        data = dict(data)
        data["rows"] = [ModeResult(**r) for r in data.get("rows", [])]
        return cls(**data)

    def merged(self, other: BenchResult) -> BenchResult:
        """This run's rows, then another run's of the same model (bench calls split by mode or size);
        a row measured again replaces the earlier one."""
        mine, theirs = (self.preset, self.n_layers, self.dtype, self.kernels), \
            (other.preset, other.n_layers, other.dtype, other.kernels)
        if mine != theirs:
            raise AuditError(f"cannot merge bench results of different set-ups: {mine} vs {theirs} "
                             "(preset, layers, dtype, kernels)")
        out = BenchResult.from_json(self.to_json())
        key = lambda r: (r.mode, r.batch, r.context)
        newer = {key(r) for r in other.rows}
        out.rows = [r for r in out.rows if key(r) not in newer] + other.rows
        out.weight_bytes = {**other.weight_bytes, **self.weight_bytes}
        out.bytes_by_kind = {**other.bytes_by_kind, **self.bytes_by_kind}
        out.warnings = sorted(set(self.warnings) | set(other.warnings))
        out.per_layer = self.per_layer or other.per_layer
        return out
