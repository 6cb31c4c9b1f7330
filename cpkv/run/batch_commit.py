"""A batch commits as a whole or not at all: what a rank does when its batch fails.

The engine restores the pool rows a failed batch wrote and commits nothing
(``CPEngine.run_batch``); rank 0 rolls the scheduler back (``HostLoop.rollback``). With the
debug checks on, each rank also takes a digest of its state before every batch and, after a
rollback, says whether the state is the same again (a host read: debug runs only).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from cpkv.run.loop import HostLoop
from cpkv_core.planning import SchedulerState
from cpkv_core.runtime import CPEngine

DIFFERS = "the state differs from before it"
"""What a rollback note says when the state is not as before the batch (a bug)."""


@dataclass(frozen=True, slots=True)
class RankState:
    """What a batch may change on one rank, as comparable values."""

    pool: str
    """blake2b of every layer's pool bytes."""
    requests: tuple[str, ...]
    stored_pages: int
    scheduler: SchedulerState | None
    """Rank 0's scheduler (allocator and token ledger); None on the other ranks."""


def pool_digest(engine: CPEngine) -> str:
    """A digest of every byte of the rank's pool (reads the device)."""
    digest = hashlib.blake2b(digest_size=16)
    for layer in engine.pool.layers:
        for tensor in (layer.latent, layer.index_k, layer.index_k_scale):
            digest.update(tensor.contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return digest.hexdigest()


def rank_state(engine: CPEngine, scheduler: SchedulerState | None) -> RankState:
    """The rank's state now, with ``scheduler`` (rank 0's, taken before the batch was
    scheduled; None on the other ranks)."""
    return RankState(
        pool_digest(engine), tuple(sorted(engine.requests)), engine.stored_pages, scheduler
    )


def roll_back(engine: CPEngine, loop: HostLoop | None, batch: int, before: RankState | None) -> str:
    """Rolls the scheduler back after ``batch`` failed (the engine has restored its pool
    already) and says what was checked: the note a ``RankFault`` carries (it holds
    ``DIFFERS`` when the state is not as before the batch)."""
    if loop is not None:
        loop.rollback(batch)
    if before is None:
        return f"batch {batch} rolled back (pool rows restored, nothing committed)"
    after = rank_state(engine, None if loop is None else loop.scheduler.state())
    differ = [
        name
        for name in ("pool", "requests", "stored_pages", "scheduler")
        if getattr(before, name) != getattr(after, name)
    ]
    if differ:
        return f"batch {batch} rolled back, but {DIFFERS}: {differ}"
    return f"batch {batch} rolled back: pool, requests and scheduler as before it (checked)"
