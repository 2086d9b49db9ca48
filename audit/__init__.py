"""CUDA-graph readiness audit for any PyTorch decode step.

    import audit
    inv = audit.scan("dsv4:tiny")            # or a factory, or "path/to/file.py:make"
    inv.df                                   # one row per hazard: category, severity, file:line, fix

Stages, each a subpackage: scan (tracer) -> detectors -> report (inventory, writers); capture
(trial capture and bisection, CUDA) and bench stand beside them; ranks wraps a scan per torchrun
rank. docs/hazards.md says what each category means.
"""

from audit.errors import AuditError
from audit.report.inventory import Inventory
from audit.scan.run import scan

__all__ = ["AuditError", "Inventory", "scan"]
