"""dsv4-audit command line: each command parses options and hands off to dsv4/ or audit/.

Bad input never shows a traceback: user errors (DSV4Error, AuditError) print one line and exit 2.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator

import typer
from rich.console import Console

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.splitlines()[0])
console = Console()
err_console = Console(stderr=True)


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """One clear line and exit 2 for anything the user can fix."""
    from dsv4.errors import DSV4Error

    try:
        from audit.errors import AuditError
    except ImportError:  # audit not built yet
        AuditError = DSV4Error  # type: ignore[misc,assignment]
    try:
        yield
    except (DSV4Error, AuditError) as e:
        err_console.print(f"[bold red]error:[/] {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        err_console.print("[bold red]interrupted[/]")
        raise typer.Exit(130) from None


def main() -> None:  # pragma: no cover - console entry for `python cli.py`
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
