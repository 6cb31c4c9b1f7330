"""``--out DIR``: the option of ``bench``, ``plan`` and ``explain``, and what they print."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape

from cpkv.common.console import err

if TYPE_CHECKING:
    from cpkv.plots import Written


def out_option(writes: str) -> Any:
    """The ``--out DIR`` option (``Annotated`` metadata) of a command that ``writes`` the
    given files there; the value is ``Path | None``."""
    return typer.Option("--out", metavar="DIR", help=f"Also write {writes} to DIR.")


def print_written(written: Written) -> None:
    """One stderr line per file written and per figure skipped."""
    for path in written.paths:
        err.print(f"wrote {escape(str(path))}", highlight=False)
    for skip in written.skipped:
        err.print(f"skipped {skip.name}.png: {escape(skip.reason)}", highlight=False)
