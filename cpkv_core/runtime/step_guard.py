"""A batch agreed by every rank (``run_agreed``), and its failures on one rank, kept so that
the group stays in step (``StepGuard``; ``failures`` says why).

The engine runs a batch's collective-free ops of the run step inside a ``region`` of their
decision point: the KV write (every strategy writes this rank's pool only), a key read from
the rank's own pool or the gathered current chunk, and the tail once its gather is done. An
exception there is recorded with its point, and the step goes on with what it already
holds, so every later collective still meets its peers; the batch then fails at the commit
vote on every rank. After the step, ``verdict`` adds the debug checks' failures and the
non-finite checks: the rows the batch wrote (blamed on the write, for certain), the hidden
states before the tail (blamed on no point: it cannot be told), and the outputs after it
(blamed on the tail, unless another rank saw a NaN before it: ``failures.agree``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol, TypeVar

import torch
from torch import Tensor

from cpkv_core.planning import DecisionPoint, ExecutionPlan, HostPlan, ScheduledBatch
from cpkv_core.runtime.debug_checks import DebugChecks
from cpkv_core.runtime.device_plan import BatchTensors
from cpkv_core.runtime.failures import (
    BatchFailed,
    FailureCause,
    LocalFailure,
    agree,
    error_failure,
    merge_failures,
)
from cpkv_core.runtime.faults import Fault
from cpkv_core.runtime.kv_pool import KVRows, PagedKVPool, SavedRows
from cpkv_core.runtime.outputs import Served, StepOutput
from cpkv_core.runtime.shadow import ShadowedEngine, ShadowPlan, run_shadowed

__all__ = ["AgreedEngine", "StepGuard", "run_agreed"]

V = TypeVar("V", Tensor, KVRows)

_WRITE = frozenset({DecisionPoint.KV_WRITE})
_OUTPUT = frozenset({DecisionPoint.OUTPUT})


class StepGuard:
    """What failed on this rank in the batch being run, and the flags the checks read.

    An idle guard (between batches, or a run step outside ``run_agreed``: a dry run)
    records nothing and lets every exception pass.
    """

    def __init__(self, fault: Fault | None = None, batch: int | None = None) -> None:
        self.fault, self.batch = fault, batch
        self.active = batch is not None
        self.failures: list[LocalFailure] = []
        self._tail_inputs_finite: list[Tensor] = []

    def record(self, failure: LocalFailure) -> None:
        """Keeps ``failure`` for the batch's vote."""
        self.failures.append(failure)

    @contextmanager
    def region(self, point: DecisionPoint) -> Iterator[None]:
        """Runs a collective-free op of ``point``'s path: an exception in it is recorded,
        not raised (the step goes on, so its later collectives still meet the peers)."""
        try:
            yield
        except Exception as exc:
            if not self.active:
                raise
            self.record(error_failure(exc, point))

    def through(self, point: DecisionPoint, host: HostPlan, values: V, last: bool) -> V:
        """``values`` through the game-day fault's failing kinds (``Fault.through``), in
        the step's ``last`` layer."""
        if self.fault is None or not last or not self.active:
            return values
        return self.fault.through(point, host, self.batch, values)

    def note_tail_input(self, hidden: Tensor) -> None:
        """Keeps whether the tail's input ``[n_local, hidden]`` is finite (a device flag)."""
        if self.active:
            self._tail_inputs_finite.append(torch.isfinite(hidden).all())

    def verdict(
        self,
        pool: PagedKVPool,
        written: Tensor,
        step: StepOutput,
        checks: list[LocalFailure],
    ) -> LocalFailure | None:
        """This rank's failure of the batch, None when it has none: what was recorded, the
        debug ``checks``' failures and the non-finite checks of the pool rows ``written``
        ``[n]`` and of ``step``'s outputs (one host read)."""
        return merge_failures([*self.failures, *checks, *self._nonfinite(pool, written, step)])

    def _nonfinite(
        self, pool: PagedKVPool, written: Tensor, step: StepOutput
    ) -> list[LocalFailure]:
        """The non-finite checks: the rows written, the step's hidden states before the
        tail (this rank's), its outputs after it; one host read."""
        rows_ok = torch.stack(
            [
                torch.isfinite(rows.latent).all() & torch.isfinite(rows.index_k_scale).all()
                for rows in (layer.select(written) for layer in pool.layers)
            ]
        ).all()
        outputs_ok = torch.isfinite(step.last_hidden).all() & torch.isfinite(step.logits).all()
        tail_ok = torch.stack([outputs_ok.new_ones(()), *self._tail_inputs_finite]).all()
        rows, tail, outputs = torch.stack([rows_ok, tail_ok, outputs_ok]).tolist()
        if not rows:
            where, what, certain = _WRITE, "a row the batch wrote holds", True
        elif not tail:
            where, what, certain = frozenset(), "the hidden states before the tail hold", False
        elif not outputs:
            # NOTE: the tail is to blame only if no rank saw a NaN before it (``certain``).
            where, what, certain = _OUTPUT, "the batch's outputs hold", False
        else:
            return []
        message = f"{what} a NaN or an infinity"
        return [LocalFailure(FailureCause.NONFINITE, where, message, certain)]


class AgreedEngine(ShadowedEngine, Protocol):
    """What an agreed batch uses of the engine that runs it (``CPEngine``)."""

    guard: StepGuard
    debug: DebugChecks | None
    fault: Fault | None

    def run_prepared(
        self, batch: ScheduledBatch, host: HostPlan, tensors: BatchTensors
    ) -> tuple[Served, SavedRows]: ...


def run_agreed(
    engine: AgreedEngine, batch: ScheduledBatch, plan: ExecutionPlan, shadow: ShadowPlan | None
) -> tuple[Served, SavedRows]:
    """Runs ``batch`` on this rank between two votes of the group (every rank together).

    The first vote follows the host half, before the step's first collective: a rank whose
    host half raised never enters the step, so no rank does. The second follows the step
    and the checks, before the commit. A failure any rank recorded makes every rank raise
    ``BatchFailed`` with the same verdict, its pool rows restored; any other exception
    restores them too and goes on (the group is out of step). Returns the served path and
    the rows to restore should the caller still fail the batch.
    """
    engine.guard = guard = StepGuard(engine.fault, batch.batch)
    if engine.debug is not None:
        engine.debug.failures = []
    try:
        prepared = None
        try:
            prepared = engine.prepare(batch, plan)
        except Exception as exc:
            guard.record(error_failure(exc))
        failure = agree(engine.comm, batch.batch, merge_failures(guard.failures))
        if failure is not None:
            raise BatchFailed(failure)
        assert prepared is not None, f"rank {engine.comm.rank}: no host half and no failure"
        if shadow is None:
            served, saved = engine.run_prepared(batch, *prepared)
        else:
            served, saved = run_shadowed(engine, batch, shadow)
        _agree_commit(engine, guard, batch, served, saved)
        return served, saved
    finally:
        engine.guard = StepGuard()


def _agree_commit(
    engine: AgreedEngine, guard: StepGuard, batch: ScheduledBatch, served: Served, saved: SavedRows
) -> None:
    """The checks after the step, then the commit vote; a failure restores the rows."""
    try:
        checks: list[LocalFailure] = []
        if engine.debug is not None:
            engine.debug.after_batch(batch, served.tensors)
            checks = engine.debug.failures
        local = guard.verdict(engine.pool, saved.rows, served.step, checks)
        failure = agree(engine.comm, batch.batch, local)
    except BaseException:
        engine.pool.restore_rows(saved)
        raise
    if failure is not None:
        engine.pool.restore_rows(saved)
        raise BatchFailed(failure)
