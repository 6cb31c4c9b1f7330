"""``cpkv bench``: the performance figures, measured side by side in one run.

Bytes are counted exactly by the communication layer; times are medians over repeats after a
warm-up. Ratios, not absolute times, are the headline.

The sections (``sections.SECTIONS``, handed in) are called in the table's order: an
in-process section measures there; a gloo section hands back its part. Then every part gives
its rank jobs (its in-process part runs then), in the same order, they all run in ONE
spawned group, and each part finishes on its runs. A section's time is what its calls took
plus its jobs' share of the group (from where the previous part's share ended to the last
batch its jobs finished; the group's start for the first).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field

from cpkv.bench.report import BenchReport
from cpkv.bench.section import BenchInputs, Figures, GeneratorPart, GroupPart, Section
from cpkv.run.jobs import BatchProgress, RankJob
from cpkv.run.runner import run_jobs_on_gloo
from cpkv_core.config import DeploymentConfig, ModelConfig
from cpkv_core.planning import BatchSpec

__all__ = ["SectionTime", "run_bench"]


@dataclass(slots=True)
class SectionTime:
    """Wall seconds one section took."""

    name: str
    seconds: float = 0.0


@dataclass(slots=True)
class _Pending:
    """A gloo section's part waiting for its runs."""

    section: Section
    part: GroupPart
    time: SectionTime
    jobs: list[RankJob] = field(default_factory=list)
    first: int = 0
    """Index of its first job in the group."""


def _chosen(sections: Sequence[Section], only: Sequence[str] | None) -> list[Section]:
    """The sections named in ``only`` (all when None), in the table's order."""
    if only is None:
        return list(sections)
    names = set(only)
    unknown = names - {s.name for s in sections}
    if unknown:
        raise ValueError(
            f"unknown bench section {', '.join(sorted(unknown))}: choose from "
            f"{', '.join(s.name for s in sections)}"
        )
    return [s for s in sections if s.name in names]


def _job_spans(began: float, pending: Sequence[_Pending], last: dict[int, float]) -> None:
    """Adds each section's share of the group: up to the last batch its last job finished
    (``last``: wall time by job), from where the previous section's share ended."""
    start = began
    for part in pending:
        ends = [last[j] for j in range(part.first, part.first + len(part.jobs)) if j in last]
        end = max(ends, default=start)
        part.time.seconds += end - start
        start = max(start, end)


def _run_group(
    pending: list[_Pending], on_section: Callable[[SectionTime], None]
) -> dict[str, Figures]:
    """Takes every part's jobs, runs them all in one group, finishes each part on its runs."""
    jobs: list[RankJob] = []
    for waiting in pending:
        began = time.perf_counter()
        waiting.jobs = waiting.part.jobs()
        waiting.time.seconds += time.perf_counter() - began
        waiting.first = len(jobs)
        jobs += waiting.jobs
    last: dict[int, float] = {}

    def on_progress(progress: BatchProgress) -> None:
        last[progress.job] = time.perf_counter()

    began = time.perf_counter()
    runs = run_jobs_on_gloo(jobs, on_progress) if jobs else []
    _job_spans(began, pending, last)
    figures: dict[str, Figures] = {}
    for waiting in pending:
        began = time.perf_counter()
        figures[waiting.section.name] = waiting.part.finish(
            runs[waiting.first : waiting.first + len(waiting.jobs)]
        )
        waiting.time.seconds += time.perf_counter() - began
        on_section(waiting.time)
    return figures


def run_bench(
    sections: Sequence[Section],
    model: ModelConfig,
    deploy: DeploymentConfig,
    batches: Sequence[BatchSpec],
    repeats: int = 3,
    warnings: Sequence[str] = (),
    debug_checks: bool = False,
    on_step: Callable[[str], None] | None = None,
    device: str = "cpu",
    cp_min_tokens: int | None = None,
    only: Sequence[str] | None = None,
    on_section: Callable[[SectionTime], None] | None = None,
) -> BenchReport:
    """Runs the ``sections`` (``sections.SECTIONS``) named in ``only`` (every one when None),
    in their order, on ``batches`` (the built-in
    trace by default in the CLI); ``on_step`` hears each section's title as it starts,
    ``on_section`` each section's time as it ends. ``cp_min_tokens`` is the minimum of the
    ``cp_off`` bytes (default: the trace's median batch size).

    Raises:
        ValueError: ``only`` names a section that does not exist.
    """
    chosen = _chosen(sections, only)
    inputs = BenchInputs(
        model, deploy, tuple(batches), repeats, debug_checks, device, cp_min_tokens
    )
    hear = on_section or (lambda _: None)
    figures: dict[str, Figures] = {}
    pending: list[_Pending] = []
    times: list[SectionTime] = []
    try:
        for section in chosen:
            if on_step is not None:
                on_step(f"{section.name}: {section.title}")
            spent = SectionTime(section.name)
            times.append(spent)
            began = time.perf_counter()
            result = section.measure(inputs)
            spent.seconds += time.perf_counter() - began
            if isinstance(result, dict):
                figures[section.name] = result
                hear(spent)
                continue
            part: GroupPart = GeneratorPart(result) if isinstance(result, Generator) else result
            pending.append(_Pending(section, part, spent))
        if pending and on_step is not None:
            names = ", ".join(p.section.name for p in pending)
            on_step(f"one gloo group for {names}")
        figures |= _run_group(pending, hear)
    finally:
        for waiting in pending:
            waiting.part.close()  # NOTE: a part's own teardown (decode processes) runs here
    merged: Figures = {}
    for section in chosen:
        merged |= figures[section.name]
    return BenchReport(
        step_time_cp_size=deploy.cp_size,
        warnings=list(warnings),
        section_seconds={t.name: t.seconds for t in times},
        **merged,
    )
