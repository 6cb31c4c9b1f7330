"""What every CLI command shares: the consoles, bad-input handling (exit 2), JSON output."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", help="Config file (else $CPKV_CONFIG, else ./cpkv.toml)."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]


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
