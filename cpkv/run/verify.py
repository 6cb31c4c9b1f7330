"""``cpkv verify``: run a trace on CP ranks at each level, compare each batch with the oracle."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cpkv.common.settings import RunSettings
from cpkv.run.explain import plan_to_json
from cpkv.run.failure_summary import FailureSummary, summarize_failures
from cpkv.run.jobs import Backend, BatchProgress, LevelRun, RankJob, job_for
from cpkv.run.runner import run_levels, run_reference
from cpkv.run.shadow import ShadowEntry, ShadowSummary, shadow_fault, summarize
from cpkv_core.config import DeploymentConfig, ModelConfig
from cpkv_core.planning import BatchSpec
from cpkv_core.runtime import (
    OUTPUT_ATOL,
    SHADOW_TAG,
    BatchComparison,
    BatchOutput,
    Fault,
    ShadowOutcome,
    compare_batch,
)
from phases import BatchPlan, PhaseId


@dataclass(frozen=True, slots=True)
class BatchRow:
    """One batch at one level: what it moved, what it stores, how it compares."""

    level: int
    batch: int
    batch_plan: BatchPlan
    """The gate's decision for the batch at this level."""
    tokens: int
    gathered_bytes_by_rank: tuple[int, ...]
    gathered_bytes_by_tag: dict[str, int]
    """Rank 0's gathered bytes per collective tag."""
    kv_bytes_by_rank: tuple[int, ...]
    comparison: BatchComparison
    shadow: ShadowOutcome | None = None
    """The shadow comparison of a sampled batch (rank 0's; every rank agrees)."""
    shadow_bytes: int = 0
    """Rank 0's gathered bytes of the shadow runs and verdict (``SHADOW_TAG``)."""


@dataclass(frozen=True, slots=True)
class LevelReport:
    """All batches of one level."""

    level: int
    rows: tuple[BatchRow, ...]
    """One row per batch of the trace, in order."""

    def __post_init__(self) -> None:
        stray = [r.batch for r in self.rows if r.level != self.level]
        assert not stray, f"level {self.level} holds rows of other levels: batches {stray}"

    @property
    def ok(self) -> bool:
        """Every batch matched the reference."""
        return all(r.comparison.ok for r in self.rows)

    @property
    def max_abs_diff(self) -> float:
        """Largest output difference over the level's batches."""
        return max((r.comparison.max_abs_diff for r in self.rows), default=0.0)


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """The verdict of a verify run."""

    levels: tuple[LevelReport, ...]
    shadow_rate: float = 0.0
    fault: str | None = None
    """The injected data-corrupting fault, ``PHASE:KIND[@BATCH]``, if any (the shadow
    summary's; a failing kind is ``failures``')."""
    failures: FailureSummary | None = None
    """The batches that failed, were rolled back and rerun, and the phases they killed."""

    @property
    def ok(self) -> bool:
        """Every level matched."""
        return all(level.ok for level in self.levels)

    def to_json(self) -> dict[str, Any]:
        """The stable JSON document of ``cpkv verify --json``."""
        return {
            "ok": self.ok,
            "tolerance": {"outputs_atol": OUTPUT_ATOL, "topk": "exact"},
            "levels": [
                {"level": lv.level, "ok": lv.ok, "max_abs_diff": lv.max_abs_diff}
                for lv in self.levels
            ],
            "shadow": shadow_summary(self).to_json(),
            **({"failures": self.failures.to_json()} if self.failures is not None else {}),
            "batches": [
                {
                    "level": row.level,
                    "batch": row.batch,
                    "ok": row.comparison.ok,
                    "tokens": row.tokens,
                    "max_abs_diff": row.comparison.max_abs_diff,
                    "topk_equal": row.comparison.topk_equal,
                    "topk_mismatches": row.comparison.topk_mismatches,
                    "nonfinite": row.comparison.nonfinite,
                    "gathered_bytes_by_rank": list(row.gathered_bytes_by_rank),
                    "gathered_bytes_by_tag": dict(row.gathered_bytes_by_tag),
                    **plan_to_json(row.batch_plan),
                    "kv_bytes_by_rank": list(row.kv_bytes_by_rank),
                }
                for lv in self.levels
                for row in lv.rows
            ],
        }


def shadow_summary(report: VerifyReport) -> ShadowSummary:
    """The shadow figures of every level of ``report``."""
    rows = [row for level in report.levels for row in level.rows]
    entries = [ShadowEntry(r.level, r.batch, r.shadow, r.shadow_bytes) for r in rows]
    wrong = sum(not row.comparison.ok for row in rows)
    return summarize(report.shadow_rate, report.fault, entries, wrong)


def _level_report(level: int, run: LevelRun, reference: list[BatchOutput]) -> LevelReport:
    rows = []
    for step, ref, got, pieces in zip(
        run.steps, reference, run.outputs, run.rank_outputs, strict=True
    ):
        rows.append(
            BatchRow(
                level=level,
                batch=step.scheduled.batch,
                batch_plan=step.decision,
                tokens=step.scheduled.num_tokens,
                gathered_bytes_by_rank=tuple(
                    sum(b for tag, b in p.gathered_bytes.items() if tag != SHADOW_TAG)
                    for p in pieces
                ),
                gathered_bytes_by_tag=pieces[0].gathered_bytes,
                kv_bytes_by_rank=tuple(p.kv_bytes for p in pieces),
                comparison=compare_batch(ref, got),
                shadow=pieces[0].shadow,
                shadow_bytes=pieces[0].gathered_bytes.get(SHADOW_TAG, 0),
            )
        )
    return LevelReport(level, tuple(rows))


def verify_job(
    model: ModelConfig,
    settings: RunSettings,
    batches: tuple[BatchSpec, ...],
    levels: Sequence[int] | None = None,
) -> RankJob:
    """What every rank runs for ``cpkv verify``, whichever launcher starts the ranks:
    ``batches`` once per level (``settings.levels()`` unless ``levels`` are given)."""
    levels = settings.levels() if levels is None else levels
    return job_for(model, settings.deploy, batches, levels, settings, settings.device)


def verify_runs(job: RankJob, runs: Sequence[LevelRun]) -> VerifyReport:
    """Compares every level run of ``job`` with the reference, which runs the scheduled
    batches of the first level."""
    reference = run_reference(job.model, job, [step.scheduled for step in runs[0].steps])
    levels_run = tuple(_level_report(run.level, run, reference) for run in runs)
    failures = summarize_failures(job.fault, job.levels, runs, len(job.batches))
    return VerifyReport(levels_run, job.shadow_rate, shadow_fault(job.fault), failures)


def verify_levels(
    model: ModelConfig,
    deploy: DeploymentConfig,
    batches: tuple[BatchSpec, ...],
    levels: Sequence[int],
    enabled: frozenset[PhaseId],
    backend: Backend,
    on_progress: Callable[[BatchProgress], None] | None = None,
    debug_checks: bool = False,
    ceiling: int | None = None,
    device: str = "cpu",
    shadow_rate: float = 0.0,
    fault: Fault | None = None,
    batch_timeout_s: float = 60.0,
) -> VerifyReport:
    """Runs ``batches`` once per level in one group this process starts (the gate deciding
    each batch as the run goes) and compares every run with the reference."""
    settings = RunSettings(
        deploy,
        enabled,
        ceiling,
        debug_checks,
        shadow_rate,
        batch_timeout_s,
        device=device,
        fault=fault,
    )
    job = verify_job(model, settings, batches, levels)
    return verify_runs(job, run_levels(job, backend, on_progress))
