"""User-facing audit errors: the CLI prints them as one line and exits with code 2."""

from __future__ import annotations


class AuditError(ValueError):
    """Bad input to the audit (target spec, options, a target that breaks the protocol)."""


class TargetFailed(AuditError):
    """The audited target raised while it ran; `inventory` holds what was traced before that.

    Not a bad-input error: the CLI writes the partial inventory, prints this line and exits 1.
    """

    def __init__(self, message: str, inventory=None):
        super().__init__(message)
        self.inventory = inventory
