"""One rank's run of one level, batch by batch, until each batch commits.

A batch that every rank agreed failed (``BatchFailed``: an exception where the group
stays in step, a debug check, a non-finite value) is rolled back on every rank (pool rows
by the engine, the scheduler by rank 0), rank 0 drops the phase to blame
(``recovery``) and broadcasts its decision, and every rank runs the batch again on the
plan the gate now picks; with no phase left to drop the run stops, named. Any other
exception (a peer that died or stalled, a raise between the step's collectives) rolls the
batch back and stops the run as a ``RankFault``.
"""

from __future__ import annotations

import dataclasses
import os
import time

import torch

from cpkv.run.batch_commit import DIFFERS, rank_state, roll_back
from cpkv.run.jobs import RankJob, final_seq_lens
from cpkv.run.loop import HostLoop, LoopStep
from cpkv.run.recovery import FailedAttempt, PhaseKill, Recovery, recover
from cpkv_core.dist import Communicator, broadcast_value
from cpkv_core.pd import PdSender
from cpkv_core.planning import BatchSpec
from cpkv_core.runtime import BatchFailed, CPEngine, RankBatchOutput
from phases import level_enabled


class RankFault(RuntimeError):
    """A rank failed inside a batch: names the rank, the level and the batch.

    The other ranks stop at their next collective (the group is aborted or torn down);
    the batch did not commit on this rank: its pool rows are restored and, on rank 0, the
    scheduler is rolled back (``batch_commit``); ``note`` says so.
    """

    def __init__(
        self, rank: int, level: int, batch: int, cause: BaseException, note: str = ""
    ) -> None:
        super().__init__(
            f"rank {rank} failed in batch {batch} (level {level}): {type(cause).__name__}: "
            f"{cause}" + (f"; {note}" if note else "")
        )
        self.rank, self.level, self.batch = rank, level, batch


class RunStopped(RuntimeError):
    """A batch failed on every rank's agreement and no phase was left to drop: the run
    stops, on every rank alike, naming the batch, its level, the cause and the ranks."""


class LevelAttempts:
    """One rank's run of level run ``run`` of ``job``: the host loop (rank 0), the engine
    and the PD sender (opened at the first batch), and what failed batches cost."""

    def __init__(self, comm: Communicator, job: RankJob, run: int) -> None:
        self.comm, self.job, self.run, self.level = comm, job, run, job.levels[run]
        enabled = level_enabled(self.level, job.enabled)
        self.loop = (
            HostLoop(
                job.deploy, enabled, job.num_pages, job.ceiling, job.shadow_rate, job.shadow_seed
            )
            if comm.rank == 0
            else None
        )
        self.engine: CPEngine | None = None
        self.sender: PdSender | None = None
        self.kills: list[PhaseKill] = []
        """Each phase a failed batch dropped, in order (rank 0's decisions)."""
        self.failed: list[FailedAttempt] = []
        """Each failed attempt of a batch that was then rerun (this rank's times)."""

    def run_batch(self, batch: BatchSpec) -> tuple[RankBatchOutput, LoopStep]:
        """Runs ``batch`` until it commits; returns its output and the step it ran as."""
        job, loop = self.job, self.loop
        while True:
            began = time.perf_counter()
            scheduler = loop.scheduler.state() if job.debug_checks and loop is not None else None
            step = broadcast_value(
                self.comm, loop.step(batch) if loop is not None else None, LoopStep
            )
            engine = self._open(step)
            if job.exit_at == (self.comm.rank, batch.batch):
                os._exit(17)
            if job.stall_at is not None and job.stall_at[:2] == (self.comm.rank, batch.batch):
                time.sleep(job.stall_at[2])
            before = rank_state(engine, scheduler) if job.debug_checks else None
            try:
                with torch.no_grad():
                    out = engine.run_batch(step.scheduled, step.decision.plan, step.shadow)
                return out, step
            except BatchFailed as failed:
                self._recover(step, failed, roll_back(engine, loop, batch.batch, before), began)
            except Exception as exc:
                note = roll_back(engine, loop, batch.batch, before)
                raise RankFault(self.comm.rank, self.level, batch.batch, exc, note) from exc

    def _open(self, step: LoopStep) -> CPEngine:
        """The engine, built at the first batch, with the PD sender when the job has one."""
        if self.engine is not None:
            return self.engine
        job = self.job
        # NOTE: the first decision fixes the KV layout (KV at rest cannot change).
        self.engine = CPEngine(
            job.model,
            job.deploy,
            self.comm,
            job.num_pages,
            kv_layout=step.decision.plan.kv_layout,
            debug_checks=job.debug_checks,
            device=job.device,
            fault=job.fault,
        )
        if job.pd is not None:
            target = dataclasses.replace(job.pd, rid_prefix=f"{job.pd.rid_prefix}{self.run}/")
            self.sender = PdSender(self.engine, target, final_seq_lens(job.batches))
        return self.engine

    def _recover(self, step: LoopStep, failed: BatchFailed, note: str, began: float) -> None:
        """After a batch failed and was rolled back: rank 0's decision, on every rank; the
        run stops (``RunStopped``) when it says so."""
        failure, batch = failed.failure, step.scheduled.batch
        if DIFFERS in note:
            raise RankFault(self.comm.rank, self.level, batch, failed, note) from failed
        decided = None
        if self.loop is not None:
            decided = recover(self.loop.gate, step.scheduled, step.decision, failure)
        recovery: Recovery = broadcast_value(self.comm, decided, Recovery, "recovery")
        if recovery.stop:
            raise RunStopped(
                f"batch {batch} (level {self.level}) failed with {failure.describe()}; "
                f"{recovery.stop}"
                + "".join(f"; phase {k.phase} was dropped for it first" for k in self._for(batch))
            ) from failed
        if recovery.kill is not None:
            # NOTE: the bounds: a phase is killed once, a batch rerun once per phase killed.
            killed = {k.phase for k in self.kills}
            assert recovery.kill.phase not in killed, f"phase {recovery.kill.phase} killed twice"
            self.kills.append(recovery.kill)
            cause, seconds = str(failure.cause), time.perf_counter() - began
            self.failed.append(FailedAttempt(batch, step.decision.phase, cause, seconds))

    def _for(self, batch: int) -> list[PhaseKill]:
        return [k for k in self.kills if k.batch == batch]
