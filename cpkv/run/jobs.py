"""What a rank job is and what its run returns: :class:`RankJob` in, :class:`LevelRun` out.

A job is a trace at one or more levels for every rank of a group (``runner`` runs it);
rank 0 streams :class:`BatchProgress` while the ranks work.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from cpkv.run.loop import LoopStep
from cpkv.run.recovery import FailedAttempt, PhaseKill
from cpkv_core.config import DeploymentConfig, ModelConfig
from cpkv_core.pd import ConcurrentWrite, LargeWrite, PdTarget, SendResult, WriteStats
from cpkv_core.planning import BatchSpec, pages_for_trace
from cpkv_core.runtime import BatchOutput, Fault, RankBatchOutput
from phases import PhaseId


class Backend(StrEnum):
    """Where CP ranks run."""

    GLOO = "gloo"
    """One process per rank, a real torch.distributed gloo group."""
    LOCAL = "local"
    """One thread per rank in this process, through the same communication interface."""


class RunKnobs(Protocol):
    """What a run sets beyond its model, deployment and trace (``RunSettings`` and ``PdJob``
    both carry it)."""

    @property
    def enabled(self) -> frozenset[PhaseId]: ...

    @property
    def ceiling(self) -> int | None: ...

    @property
    def debug_checks(self) -> bool: ...

    @property
    def shadow_rate(self) -> float: ...

    @property
    def fault(self) -> Fault | None: ...

    @property
    def batch_timeout_s(self) -> float: ...


@dataclass(frozen=True, slots=True)
class RankJob:
    """Everything a rank needs to run a trace at several levels; it travels to spawned ranks
    as a typed frame (every field's annotation is one the codec carries)."""

    model: ModelConfig
    deploy: DeploymentConfig
    batches: tuple[BatchSpec, ...]
    levels: tuple[int, ...]
    """Level of each run, in order (a level may repeat: bench rounds)."""
    num_pages: int
    enabled: frozenset[PhaseId] = frozenset(PhaseId)
    """Phases enabled for the deployment; a run at level L hands its gate those <= L."""
    ceiling: int | None = None
    debug_checks: bool = False
    """Run the sharded-KV invariant checks (they synchronise)."""
    pd: PdTarget | None = None
    """Stream every request to this decode server (PD) as its pages fill, batch by batch."""
    device: str = "cpu"
    """Where weights, pools and run-step tensors live."""
    shadow_rate: float = 0.0
    """Share of batches (0..1) shadow-verified, drawn from the batch index and the seed."""
    shadow_seed: int = 0
    fault: Fault | None = None
    """A game-day fault injected into the candidate path it targets (``--inject-fault``)."""
    exit_at: tuple[int, int] | None = None
    """Game day for rank faults: ``(rank, batch)`` exits abruptly (no cleanup) before
    running that batch, as a killed process would."""
    batch_timeout_s: float = 60.0
    """Seconds one collective of a batch waits for a stalled rank (``--batch-timeout-s``);
    then every waiting rank stops and the run names the stalled one. Distinct from the
    run's whole timeout."""
    stall_at: tuple[int, int, float] | None = None
    """Game day for a stalled rank: ``(rank, batch, seconds)`` sleeps that long before
    running that batch, while the others wait in its first collective."""


@dataclass(frozen=True, slots=True)
class RankRun:
    """One rank's part of one level: its batch outputs, the loop's steps (rank 0 only) and,
    with PD, its send results."""

    outputs: list[RankBatchOutput]
    steps: list[LoopStep]
    pd: list[SendResult]
    pd_stats: WriteStats | None = None
    pd_probe: LargeWrite | None = None
    pd_concurrent: ConcurrentWrite | None = None
    kills: tuple[PhaseKill, ...] = ()
    """The phases failed batches dropped, in order (``attempts``)."""
    failed: tuple[FailedAttempt, ...] = ()
    """The failed attempts of batches that were rerun, in order."""


@dataclass(frozen=True, slots=True)
class BatchProgress:
    """Sent by rank 0 after each batch: level run index and batch index (and the job's index
    among the group's jobs)."""

    run: int
    batch: int
    job: int = 0


@dataclass(frozen=True, slots=True)
class LevelRun:
    """One level's run of a trace: the loop's steps, merged outputs and per-rank pieces."""

    level: int
    steps: tuple[LoopStep, ...]
    outputs: tuple[BatchOutput, ...]
    rank_outputs: tuple[tuple[RankBatchOutput, ...], ...]
    """``rank_outputs[batch][rank]``."""
    pd: tuple[tuple[SendResult, ...], ...] = ()
    """``pd[rank]``: how each request went from each rank (PD runs only)."""
    pd_stats: tuple[WriteStats, ...] = ()
    """``pd_stats[rank]``: what each rank's PD writes cost (PD runs only)."""
    pd_probe: LargeWrite | None = None
    """One large write of the run's KV bytes, timed after it (``PdTarget.probe``)."""
    pd_concurrent: tuple[ConcurrentWrite, ...] = ()
    """``pd_concurrent[rank]``: every rank writing its share of the same bytes in one call,
    at once, timed after the large write (``PdTarget.probe``)."""
    kills: tuple[PhaseKill, ...] = ()
    """The phases failed batches dropped (rank 0's record)."""
    failed: tuple[FailedAttempt, ...] = ()
    """The failed attempts of batches that were rerun (rank 0's times)."""


def request_order(batches: Sequence[BatchSpec]) -> list[str]:
    """Every rid of a trace, in order of first appearance."""
    return list(dict.fromkeys(req.rid for batch in batches for req in batch.requests))


def final_seq_lens(batches: Sequence[BatchSpec]) -> dict[str, int]:
    """Every rid of a trace, in order of first appearance, with its tokens after its last
    chunk (a serving scheduler knows it from the prompt)."""
    lens = dict.fromkeys(request_order(batches), 0)
    for batch in batches:
        lens.update((req.rid, req.seq_len) for req in batch.requests)
    return lens


def job_for(
    model: ModelConfig,
    deploy: DeploymentConfig,
    batches: Sequence[BatchSpec],
    levels: Sequence[int],
    knobs: RunKnobs,
    device: str = "cpu",
    pd: PdTarget | None = None,
) -> RankJob:
    """``batches`` at ``levels`` on ``deploy`` with the run knobs of ``knobs``, and pages
    for the whole trace."""
    return RankJob(
        model,
        deploy,
        tuple(batches),
        tuple(levels),
        pages_for_trace(batches, deploy.page_size, deploy.cp_size),
        enabled=knobs.enabled,
        ceiling=knobs.ceiling,
        debug_checks=knobs.debug_checks,
        pd=pd,
        device=device,
        shadow_rate=knobs.shadow_rate,
        fault=knobs.fault,
        batch_timeout_s=knobs.batch_timeout_s,
    )
