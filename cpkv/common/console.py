"""What every CLI command shares: the consoles, bad-input handling (exit 2), JSON output."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import typer
from pydantic import ValidationError
from rich.console import Console, ConsoleDimensions
from rich.markup import escape

NO_TERMINAL_WIDTH = 120
"""Columns tables are laid out to when the output is not a terminal and ``COLUMNS`` is unset."""


class AppConsole(Console):
    """A rich console that lays out at ``$COLUMNS`` or :data:`NO_TERMINAL_WIDTH` columns when
    it does not write to a terminal (a pipe, a file, CI), instead of rich's 80.

    ``$COLUMNS`` is read at each print: rich reads it once, when the console is made, and
    this module's consoles are made at import, so a later ``COLUMNS=100 cpkv ...`` in the same
    process (a test's runner, an embedding tool) would lay out at whatever it was then.
    """

    def __init__(self, *, width: int | None = None, **kwargs: Any) -> None:
        super().__init__(width=width, **kwargs)
        self._chosen_width = width
        """The width the caller fixed (argument or setter); None: ``$COLUMNS`` decides."""

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        if self.is_terminal:
            return size
        if self._chosen_width is not None:
            return ConsoleDimensions(self._chosen_width, size.height)
        columns = os.environ.get("COLUMNS", "")
        width = int(columns) if columns.isdigit() and int(columns) > 0 else NO_TERMINAL_WIDTH
        return ConsoleDimensions(width, size.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        self._width, self._height = new_size
        self._chosen_width = new_size[0]

    @property
    def width(self) -> int:
        return self.size.width

    @width.setter
    def width(self, width: int) -> None:
        self._width = self._chosen_width = width


out = AppConsole(soft_wrap=True)
err = AppConsole(stderr=True, soft_wrap=True)


class BadInput(Exception):
    """Bad input or usage: reported on stderr, exit code 2."""


@contextmanager
def bad_input_exits() -> Iterator[None]:
    """Turns bad input (trace, flags, options) into a message on stderr and exit code 2."""
    try:
        yield
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        err.print(f"[red]error:[/red] {escape(where)}: {escape(first['msg'])}", highlight=False)
        raise typer.Exit(2) from exc
    except (BadInput, ValueError) as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(2) from exc


def emit(as_json: bool, document: dict[str, Any], render: Callable[[], None]) -> None:
    """Prints ``document`` as JSON on stdout, or calls ``render`` for people."""
    if as_json:
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
    else:
        render()


def warn(warnings: Sequence[str]) -> None:
    """Prints each warning on stderr, so ``--json`` output on stdout stays one document."""
    for warning in warnings:
        err.print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False)
