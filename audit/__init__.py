"""CUDA-graph readiness audit for any PyTorch decode step.

    import audit
    inv = audit.scan("dsv4:tiny")            # or a factory, or "path/to/file.py:make"
    inv.df                                   # one row per hazard: category, severity, file:line, fix

See shared/design/HAZARDS.md for what each category means.
"""

from audit.errors import AuditError
from audit.inventory import Inventory
from audit.scan import scan

__all__ = ["AuditError", "Inventory", "scan"]
