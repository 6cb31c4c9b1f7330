"""The ``rollback`` figure of ``cpkv bench``: what the rollback's save copy costs each batch.

Before its run step writes KV, every batch saves the pool rows it will write
(``CPEngine.run_plan``: ``pool.save_rows(tensors.write_dest)``) so that a failed batch can be
undone. Here the trace runs once at levels 0, 2 and 5 on the in-process group. Per batch
every rank plans it as the engine does (``CPEngine.prepare``) and times the same save of the
same rows, a warm-up and then ``5 x repeats`` times, all ranks together; then the batch runs
through ``run_batch`` (which saves once more, runs the step and commits), and its time on the
rank is the step time. Save and step are each the slowest rank's; the ratio is save over
step. Bytes are counted from the saved tensors, per rank. The step is timed once per batch:
a full trace per repeat would cost the bench seconds per level, and the save (the small,
noisy part) is the one repeated.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import torch

from cpkv.run.loop import HostLoop, LoopStep
from cpkv_core.config import DeploymentConfig, ModelConfig
from cpkv_core.dist import Communicator, run_local
from cpkv_core.planning import BatchSpec, pages_for_trace
from cpkv_core.runtime import CPEngine, kv_bytes_per_token
from phases import PhaseId, level_enabled

LEVELS = (0, 2, 5)
"""Replicated (every rank saves every row the batch writes), sharded, compute-owner write."""
WARMUP = 1
"""Saves per batch and rank run and dropped before the timed ones."""


@dataclass(frozen=True, slots=True)
class RankSample:
    """One rank's measurement of one batch."""

    rows: int
    """Pool rows saved (``write_dest``'s length)."""
    nbytes: int
    """Bytes the save copied, counted from its tensors."""
    save_seconds: float
    """Median of the timed saves."""
    batch_seconds: float
    """The batch's own run (``run_batch``: plan, save, run step, commit; on CUDA until the
    device is done)."""


@dataclass(frozen=True, slots=True)
class RollbackBatch:
    """One batch at one level: what each rank saved, and the save against the batch's run."""

    level: int
    batch: int
    phase: int
    tokens: int
    saved_rows_by_rank: tuple[int, ...]
    saved_bytes_by_rank: tuple[int, ...]
    save_seconds: float
    """The slowest rank's median save."""
    step_seconds: float
    """The slowest rank's run of the batch (what ``step_time`` sums over a trace)."""

    @property
    def save_over_step(self) -> float:
        """Save over step: the share of a batch's time the rollback's copy costs."""
        return self.save_seconds / self.step_seconds

    def to_json(self) -> dict[str, Any]:
        """One row of ``rollback.levels[].batches``."""
        fields = {k: v for k, v in asdict(self).items() if k != "level"}
        return fields | {"save_over_step": self.save_over_step}


@dataclass(frozen=True, slots=True)
class RollbackSummary:
    """Some batches' save copy in three numbers."""

    save_over_step: float
    """Median over the batches of save over step."""
    saved_bytes_per_batch: float
    """Mean over the batches of the busiest rank's saved bytes."""
    saved_bytes: int
    """Every rank's saved bytes, summed over the batches."""

    @classmethod
    def of(cls, rows: Sequence[RollbackBatch]) -> RollbackSummary:
        """The summary of ``rows``."""
        return cls(
            statistics.median(row.save_over_step for row in rows),
            statistics.mean(max(row.saved_bytes_by_rank) for row in rows),
            sum(sum(row.saved_bytes_by_rank) for row in rows),
        )


@dataclass(frozen=True, slots=True)
class RollbackFigure:
    """The save copy against the batch's run, per batch, at every level of ``LEVELS``."""

    cp_size: int
    row_bytes: int
    """Bytes one token row occupies across all layers (what a save copies per row)."""
    repeats: int
    """Timed saves per batch and rank, after the warm-up."""
    batches: tuple[RollbackBatch, ...]

    @property
    def levels(self) -> list[int]:
        """The levels measured, ascending."""
        return sorted({row.level for row in self.batches})

    def level_rows(self, level: int) -> list[RollbackBatch]:
        """The batches of ``level``, in trace order."""
        return [row for row in self.batches if row.level == level]

    def summary(self, level: int | None = None) -> RollbackSummary:
        """Of ``level``'s batches, or of every level's (the headline) when None."""
        return RollbackSummary.of(self.batches if level is None else self.level_rows(level))

    def to_json(self) -> dict[str, Any]:
        """The ``rollback`` document of ``cpkv bench --json``."""
        headline = self.summary()
        return {
            "cp_size": self.cp_size,
            "backend": "local",
            "repeats": self.repeats,
            "row_bytes": self.row_bytes,
            "save_over_step": headline.save_over_step,
            "saved_bytes_per_batch": headline.saved_bytes_per_batch,
            "levels": [
                {"level": level}
                | asdict(self.summary(level))
                | {"batches": [row.to_json() for row in self.level_rows(level)]}
                for level in self.levels
            ],
        }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_batch(engine: CPEngine, step: LoopStep, rounds: int) -> RankSample:
    """Times the save of the rows ``step`` will write (every rank together, a warm-up first),
    then runs the batch through ``run_batch``, which saves them once more and commits."""
    _, tensors = engine.prepare(step.scheduled, step.decision.plan)
    samples = []
    for _ in range(WARMUP + rounds):
        engine.comm.barrier()
        _sync(engine.device)
        start = time.perf_counter()
        saved = engine.pool.save_rows(tensors.write_dest)
        _sync(engine.device)
        samples.append(time.perf_counter() - start)
    engine.comm.barrier()
    start = time.perf_counter()
    engine.run_batch(step.scheduled, step.decision.plan)
    _sync(engine.device)
    batch_seconds = time.perf_counter() - start
    save = statistics.median(samples[WARMUP:])
    return RankSample(int(saved.rows.numel()), saved.nbytes, save, batch_seconds)


def _measure_level(
    comm: Communicator,
    model: ModelConfig,
    deploy: DeploymentConfig,
    steps: Sequence[LoopStep],
    num_pages: int,
    rounds: int,
    device: str,
) -> list[RankSample]:
    """On one rank: a fresh engine, every batch timed then committed, in order."""
    layout = steps[0].decision.plan.kv_layout
    engine = CPEngine(model, deploy, comm, num_pages, layout, device=device)
    with torch.no_grad():
        samples = [_time_batch(engine, step, rounds) for step in steps]
    engine.close()
    return samples


def _batch_row(level: int, step: LoopStep, pieces: Sequence[RankSample]) -> RollbackBatch:
    return RollbackBatch(
        level=level,
        batch=step.scheduled.batch,
        phase=int(step.decision.phase),
        tokens=step.scheduled.num_tokens,
        saved_rows_by_rank=tuple(p.rows for p in pieces),
        saved_bytes_by_rank=tuple(p.nbytes for p in pieces),
        save_seconds=max(p.save_seconds for p in pieces),
        step_seconds=max(p.batch_seconds for p in pieces),
    )


def rollback_figure(
    model: ModelConfig,
    deploy: DeploymentConfig,
    batches: Sequence[BatchSpec],
    repeats: int,
    levels: Sequence[int] = LEVELS,
    device: str = "cpu",
) -> RollbackFigure:
    """Runs ``batches`` once at each of ``levels`` on ``deploy.cp_size`` in-process ranks,
    every phase up to the level enabled, timing each batch's save ``5 x repeats`` times (at
    least 5) after a warm-up beside the batch's run."""
    saves = max(5, 5 * repeats)
    num_pages = pages_for_trace(batches, deploy.page_size, deploy.cp_size)
    rows: list[RollbackBatch] = []
    for level in levels:
        loop = HostLoop(deploy, level_enabled(level, frozenset(PhaseId)), num_pages)
        steps = [loop.step(batch) for batch in batches]
        measure = partial(
            _measure_level,
            model=model,
            deploy=deploy,
            steps=steps,
            num_pages=num_pages,
            rounds=saves,
            device=device,
        )
        per_rank = run_local(deploy.cp_size, measure)
        rows.extend(
            _batch_row(level, step, [per_rank[r][i] for r in range(deploy.cp_size)])
            for i, step in enumerate(steps)
        )
    row_bytes = kv_bytes_per_token(model, deploy.index_k_dtype) * model.num_layers
    return RollbackFigure(deploy.cp_size, row_bytes, saves, tuple(rows))
