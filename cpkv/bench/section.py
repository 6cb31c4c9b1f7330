"""What a section of ``cpkv bench`` is (``sections.SECTIONS`` lists them, ``suite.run_bench``
runs them): its name, its title and its function, which measures in-process and returns its
figures, or hands back a ``GroupPart`` whose jobs run on the bench's one gloo group."""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Protocol

from cpkv.run.jobs import LevelRun, RankJob
from cpkv_core.config import DeploymentConfig, ModelConfig
from cpkv_core.planning import BatchSpec

__all__ = [
    "BenchInputs",
    "Figures",
    "GeneratorPart",
    "GroupPart",
    "GroupRuns",
    "Section",
    "SectionGenerator",
]

Figures = dict[str, Any]
"""``BenchReport`` fields by name."""
GroupRuns = list[list[LevelRun]]
"""Each job's level runs, in the order of the jobs."""
SectionGenerator = Generator[list[RankJob], GroupRuns, Figures]
"""A gloo section as a generator (``sections`` module docstring)."""


class GroupPart(Protocol):
    """A section on gloo ranks."""

    def jobs(self) -> list[RankJob]:
        """Its in-process part, then its rank jobs."""

    def finish(self, runs: GroupRuns) -> Figures:
        """Its figures from its jobs' runs."""

    def close(self) -> None:
        """Releases what it holds (processes), whatever happened; a no-op once done."""


class GeneratorPart:
    """A generator section (``sections`` module docstring) as a ``GroupPart``."""

    def __init__(self, part: SectionGenerator) -> None:
        self.part = part

    def jobs(self) -> list[RankJob]:
        return next(self.part)

    def finish(self, runs: GroupRuns) -> Figures:
        try:
            self.part.send(runs)
        except StopIteration as done:
            figures: Figures = done.value
            return figures
        raise RuntimeError("a bench section yielded its jobs twice")

    def close(self) -> None:
        self.part.close()


@dataclass(frozen=True, slots=True)
class BenchInputs:
    """What every section measures on."""

    model: ModelConfig
    deploy: DeploymentConfig
    batches: tuple[BatchSpec, ...]
    repeats: int
    """Timed rounds per figure, after a warm-up (``--repeats``)."""
    debug_checks: bool
    device: str
    cp_min_tokens: int | None
    """The ``cp_off`` bytes' minimum; None: the trace's median batch size."""


@dataclass(frozen=True, slots=True)
class Section:
    """One section of the bench (``sections`` module docstring)."""

    name: str
    """What ``--only`` takes (and the progress line names)."""
    title: str
    """What it measures, in a few words."""
    measure: Callable[[BenchInputs], Figures | GroupPart | SectionGenerator]
    """Measures it (``sections`` module docstring); a generator function is wrapped in
    ``GeneratorPart``."""
