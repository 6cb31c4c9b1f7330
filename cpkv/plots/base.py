"""What every figure shares: the record of what it drew, the Agg canvas, colours, writing.

A plot function takes a command's JSON document and returns a :class:`Plot` (the figure and
every series it drew, so tests compare the drawn numbers with the JSON) or a :class:`Skip`
when the document lacks the figure's key.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

Document = Mapping[str, Any]
"""A command's JSON document, as ``--json`` prints it."""

LEVEL_COLORS = ("#7f7f7f", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd")
"""One colour per level / phase 0..5, the same in every figure."""
DPI = 100
"""Pixels per inch of every PNG."""


def level_color(level: int) -> str:
    """The colour of level (or phase) ``level``."""
    return LEVEL_COLORS[level % len(LEVEL_COLORS)]


@dataclass(frozen=True, slots=True)
class Series:
    """One drawn series: a line, or one set of bars."""

    label: str
    x: tuple[Any, ...]
    y: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class Plot:
    """One figure: its file stem, the question it answers, and every series it drew."""

    name: str
    title: str
    figure: Figure = field(repr=False)
    series: tuple[Series, ...]

    def to_json(self) -> dict[str, Any]:
        """The numbers behind the PNG."""
        return {"title": self.title, "series": [asdict(s) for s in self.series]}


@dataclass(frozen=True, slots=True)
class Skip:
    """A figure not drawn, and why (its key is absent from the document)."""

    name: str
    reason: str


PlotFn = Callable[[Document], "Plot | Skip"]
"""Draws one figure from one document."""


def new_figure(width: float = 8.0, height: float = 4.5, ncols: int = 1) -> Figure:
    """A figure on the Agg canvas (no display, no global pyplot state)."""
    figure = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    figure.subplots(1, ncols)
    return figure


@dataclass(frozen=True, slots=True)
class Written:
    """What :func:`write_outputs` wrote and skipped."""

    paths: tuple[Path, ...]
    plots: tuple[Plot, ...]
    skipped: tuple[Skip, ...]


def write_outputs(
    out_dir: Path,
    stem: str,
    documents: Mapping[str, Document],
    figures: Sequence[tuple[str, PlotFn]],
) -> Written:
    """Writes each document as ``NAME.json`` in ``out_dir``, each figure drawn from its
    document as ``PLOT.png``, and the drawn numbers as ``STEM.figures.json``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, document in documents.items():
        path = out_dir / f"{name}.json"
        path.write_text(json.dumps(document, indent=2) + "\n")
        paths.append(path)
    plots, skipped = [], []
    for doc_name, plot_fn in figures:
        result = plot_fn(documents[doc_name])
        if isinstance(result, Skip):
            skipped.append(result)
            continue
        path = out_dir / f"{result.name}.png"
        result.figure.savefig(path, dpi=DPI)
        plots.append(result)
        paths.append(path)
    record = out_dir / f"{stem}.figures.json"
    record.write_text(json.dumps({f"{p.name}.png": p.to_json() for p in plots}, indent=2) + "\n")
    paths.append(record)
    return Written(tuple(paths), tuple(plots), tuple(skipped))
