"""User-facing errors: the CLI turns these into one line and exit code 2, never a traceback."""


class DSV4Error(ValueError):
    """Bad input from the user (preset, checkpoint, token ids, call order)."""
