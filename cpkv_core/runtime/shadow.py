"""Shadow verification of one sampled batch: each optimized path against its fallback.

The loop hands a ``ShadowPlan``: the phases to check, highest first, and the plan of every
subset of them switched off. For each phase the candidate (the plan with the phases found
bad so far switched off) and its fallback (the same with this phase off too) are run from
the same pool state and compared: outputs (last-token states, logits, top-k in batch order),
the key rows read (when both split alike) and the pool rows written. A mismatch switches the
phase off for the rest of the batch's checks; the batch is served from the last path that
survived, and the pool ends as that path leaves it (the fallback runs last, and a match
means equal rows written). Every rank reaches the same verdict (one small all-gather), so
rank 0's gate can trip the kill switch before the next batch.

The first candidate run is the batch's ordinary run; every other run and the verdict are
counted under ``SHADOW_TAG``. Comparisons read device values: shadow batches synchronise.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from cpkv_core.dist.comm import CommStats, Communicator, GatherHandle
from cpkv_core.planning import ExecutionPlan, HostPlan, ScheduledBatch
from cpkv_core.runtime.device_plan import BatchTensors
from cpkv_core.runtime.kv_pool import KVRows, PagedKVPool, SavedRows
from cpkv_core.runtime.outputs import (
    OUTPUT_ATOL,
    Served,
    ShadowMismatch,
    ShadowOutcome,
    StepOutput,
    max_abs_diff,
)

__all__ = ["SHADOW_TAG", "ShadowPlan", "ShadowedEngine", "run_shadowed"]

SHADOW_TAG = "shadow"
"""Collective tag of every shadow run and verdict, so their bytes are counted apart."""

_WHAT = ("", "outputs", "top-k", "rows read", "rows written")
"""What a shadow verdict code names (``_verdict``)."""


class ShadowedEngine(Protocol):
    """What a shadowed batch uses of the engine that runs it (``CPEngine``); ``comm`` is
    swapped for a tagged one while the extra runs go."""

    comm: Communicator

    @property
    def pool(self) -> PagedKVPool: ...

    def prepare(
        self, batch: ScheduledBatch, plan: ExecutionPlan
    ) -> tuple[HostPlan, BatchTensors]: ...

    def run_step(
        self,
        host: HostPlan,
        tensors: BatchTensors,
        batch: ScheduledBatch | None = None,
        reads: list[KVRows] | None = None,
    ) -> StepOutput: ...

    def all_gather_tokens(
        self, local: Tensor, host: HostPlan, tensors: BatchTensors, tag: str
    ) -> Tensor: ...

    def run_plan(self, batch: ScheduledBatch, plan: ExecutionPlan) -> tuple[Served, SavedRows]: ...


@dataclass(frozen=True, slots=True)
class ShadowPlan:
    """What a sampled batch checks: ``phases`` highest first, and the plan for every set
    of them switched off (the empty set is the gate's chosen plan)."""

    phases: tuple[int, ...]
    plans: Mapping[frozenset[int], ExecutionPlan]


class _Tagged:
    """A communicator that counts every all-gather under one tag."""

    def __init__(self, comm: Communicator, tag: str) -> None:
        self.comm, self.tag = comm, tag
        self.rank, self.world_size = comm.rank, comm.world_size
        self.stats: CommStats = comm.stats

    def all_gather(self, tensor: Tensor, tag: str) -> Tensor:
        del tag
        return self.comm.all_gather(tensor, self.tag)

    def all_gather_async(self, tensor: Tensor, tag: str, out: Tensor | None = None) -> GatherHandle:
        del tag
        return self.comm.all_gather_async(tensor, self.tag, out)

    def barrier(self) -> None:
        self.comm.barrier()

    def all_gather_ints(self, values: Sequence[int]) -> list[tuple[int, ...]]:
        return self.comm.all_gather_ints(values)

    def gather_bytes(self, data: bytes) -> list[bytes] | None:
        return self.comm.gather_bytes(data)

    def broadcast_bytes(self, data: bytes | None) -> bytes:
        return self.comm.broadcast_bytes(data)

    def gather_objects(self, obj: object) -> list[object] | None:
        return self.comm.gather_objects(obj)

    def broadcast_object(self, obj: object) -> object:
        return self.comm.broadcast_object(obj)


class _PoolGuard:
    """The pre-batch values of every pool row a run of the batch may write."""

    def __init__(self, pool: PagedKVPool) -> None:
        self.pool = pool
        self.rows = torch.empty(0, dtype=torch.int64, device=pool.layers[0].latent.device)
        self.saved = [layer.select(self.rows) for layer in pool.layers]

    def cover(self, dest: Tensor) -> None:
        """Saves rows of ``dest`` not saved yet; call before any run writes them."""
        new = torch.unique(dest[~torch.isin(dest, self.rows)])
        if len(new) == 0:
            return
        self.saved = [
            _cat(s, layer.select(new))
            for s, layer in zip(self.saved, self.pool.layers, strict=True)
        ]
        self.rows = torch.cat([self.rows, new])

    def saved_rows(self) -> SavedRows:
        """The covered rows' pre-batch values."""
        return SavedRows(self.rows, tuple(self.saved))

    def restore(self) -> None:
        for layer, saved in enumerate(self.saved):
            self.pool.write(layer, self.rows, saved)


def _cat(a: KVRows, b: KVRows) -> KVRows:
    return KVRows(
        torch.cat([a.latent, b.latent]),
        torch.cat([a.index_k.view(torch.uint8), b.index_k.view(torch.uint8)]).view(a.index_k.dtype),
        torch.cat([a.index_k_scale, b.index_k_scale]),
    )


def _same(a: KVRows, b: KVRows) -> bool:
    return (
        a.latent.shape == b.latent.shape
        and torch.equal(a.latent, b.latent)
        and torch.equal(a.index_k.view(torch.uint8), b.index_k.view(torch.uint8))
        and torch.equal(a.index_k_scale, b.index_k_scale)
    )


@dataclass(frozen=True, slots=True)
class _Run:
    served: Served
    reads: list[KVRows]
    topk: Tensor  # [num_tokens, num_layers, index_topk] in batch order
    written: list[KVRows]  # per layer, the pool rows of ``rows`` after the run


def _run(engine: ShadowedEngine, batch: ScheduledBatch, plan: ExecutionPlan, rows: Tensor) -> _Run:
    reads: list[KVRows] = []
    host, tensors = engine.prepare(batch, plan)
    step = engine.run_step(host, tensors, batch, reads)
    topk = engine.all_gather_tokens(step.topk.transpose(0, 1), host, tensors, SHADOW_TAG)
    written = [layer.select(rows) for layer in engine.pool.layers]
    return _Run(Served(host, tensors, step), reads, topk, written)


def _verdict(cand: _Run, fallback: _Run) -> tuple[int, float]:
    """(0 equal, 1 outputs, 2 top-k, 3 rows read, 4 rows written: the index into ``_WHAT``;
    largest output difference)."""
    a, b = cand.served.step, fallback.served.step
    diff = max(max_abs_diff(a.last_hidden, b.last_hidden), max_abs_diff(a.logits, b.logits))
    if diff > OUTPUT_ATOL:
        return 1, diff
    if not torch.equal(cand.topk, fallback.topk):
        # NOTE: keys picked differently with outputs within tolerance still differ.
        return 2, diff
    if cand.served.host.attended == fallback.served.host.attended and not all(
        _same(x, y) for x, y in zip(cand.reads, fallback.reads, strict=True)
    ):
        return 3, diff
    if not all(_same(x, y) for x, y in zip(cand.written, fallback.written, strict=True)):
        return 4, diff
    return 0, diff


def run_shadowed(
    engine: ShadowedEngine, batch: ScheduledBatch, shadow: ShadowPlan
) -> tuple[Served, SavedRows]:
    """Runs ``batch`` under ``shadow`` on this rank (every rank together); see the module.

    Returns the served path and the pre-batch values of every row a run wrote, so that a
    failure before the commit can undo the batch (a failure in here already has).
    """

    start = time.perf_counter()
    guard, main_comm = _PoolGuard(engine.pool), engine.comm
    excluded: frozenset[int] = frozenset()
    served: Served | None = None
    compared: list[int] = []
    mismatches: list[ShadowMismatch] = []
    main_seconds = 0.0
    try:
        for phase in shadow.phases:
            plan, fallback_plan = shadow.plans[excluded], shadow.plans[excluded | {phase}]
            if plan == fallback_plan:
                continue  # NOTE: already off: a phase it needs was found bad
            dests = [engine.prepare(batch, p)[1].write_dest for p in (plan, fallback_plan)]
            for dest in dests:
                guard.cover(dest)
            rows = torch.unique(torch.cat(dests))
            guard.restore()
            run_start = time.perf_counter()
            cand = _run(engine, batch, plan, rows)
            if not compared:
                # NOTE: the first candidate run is the batch's ordinary run.
                main_seconds = time.perf_counter() - run_start
                engine.comm = _Tagged(main_comm, SHADOW_TAG)
            compared.append(phase)
            guard.restore()
            fallback = _run(engine, batch, fallback_plan, rows)
            local = torch.tensor(_verdict(cand, fallback), dtype=torch.float64)
            agreed = engine.comm.all_gather(local, SHADOW_TAG).amax(dim=0)
            code, diff = int(agreed[0]), float(agreed[1])
            if code:
                worst = diff if code == 1 else float("inf")
                mismatches.append(ShadowMismatch(phase, worst, _WHAT[code]))
                excluded |= {phase}
            served = fallback.served if code else cand.served
    except BaseException:
        # NOTE: a failed batch commits nothing: the pool goes back to its pre-batch rows.
        guard.restore()
        raise
    finally:
        engine.comm = main_comm
    if served is None:
        plain, saved = engine.run_plan(batch, shadow.plans[frozenset()])
        return dataclasses.replace(plain, shadow=ShadowOutcome((), (), 0.0)), saved
    seconds = time.perf_counter() - start - main_seconds
    outcome = ShadowOutcome(tuple(compared), tuple(mismatches), seconds)
    return dataclasses.replace(served, shadow=outcome), guard.saved_rows()
