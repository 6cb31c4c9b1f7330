"""The batch progress bar a run shows on stderr while its ranks work."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cpkv.common.console import err
from cpkv.run.jobs import BatchProgress

R = TypeVar("R")

OnProgress = Callable[[BatchProgress], None]


def with_progress(
    show: bool, description: str, total: int, run: Callable[[OnProgress | None], R]
) -> R:
    """``run(on_progress)``, with a progress bar of ``total`` batches on stderr if ``show``."""
    if not show:
        return run(None)
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=err, transient=True) as progress:
        task = progress.add_task(description, total=total)

        def advance(_: BatchProgress) -> None:
            progress.advance(task)

        return run(advance)
