"""An in-process group of ranks (one thread each) behind the ``Communicator`` interface.

Fast property tests and the ``--backend local`` runs use it; it counts bytes exactly like
the real process group (``comm.record_all_gather``) and imports no ``torch.distributed``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TypeVar, cast

import torch
from torch import Tensor

from cpkv_core.dist.comm import CommStats, Communicator, GatherHandle, record_all_gather

__all__ = ["LocalCommunicator", "LocalGroup", "run_local"]

T = TypeVar("T")


class LocalGroup:
    """An in-process group of ``world_size`` ranks, one thread per rank.

    Collectives rendezvous on a ``threading.Barrier``; ``abort()`` (or a wait longer than
    ``timeout_s``) breaks it so no rank waits forever for a rank that died.
    """

    def __init__(self, world_size: int, timeout_s: float | None = 120.0) -> None:
        if world_size < 1:
            raise ValueError(f"LocalGroup world_size must be >= 1, got {world_size}")
        self.world_size = world_size
        self._barrier = threading.Barrier(world_size, timeout=timeout_s)
        self._slots: list[object] = [None] * world_size
        self._comms = [LocalCommunicator(self, rank) for rank in range(world_size)]

    def communicators(self) -> list[LocalCommunicator]:
        """One communicator per rank, in rank order; use each from its own thread."""
        return list(self._comms)

    def abort(self) -> None:
        """Breaks the rendezvous: ranks waiting (now or later) raise BrokenBarrierError."""
        self._barrier.abort()

    def exchange(self, rank: int, obj: object) -> list[object]:
        """Every rank posts ``obj`` and gets all ranks' objects, in rank order."""
        self._slots[rank] = obj
        self._barrier.wait()
        gathered = list(self._slots)
        # NOTE: the second wait keeps a fast rank from overwriting its slot with the next
        # collective's object before every rank has read this one.
        self._barrier.wait()
        return gathered


class LocalCommunicator:
    """A ``Communicator`` for one rank of a ``LocalGroup``."""

    def __init__(self, group: LocalGroup, rank: int) -> None:
        self.group = group
        self.rank = rank
        self.world_size = group.world_size
        self.stats = CommStats()

    def all_gather(self, tensor: Tensor, tag: str) -> Tensor:
        """See ``Communicator.all_gather``; raises ValueError on mismatched inputs."""
        record_all_gather(self.stats, tag, tensor, self.world_size)
        posted = self.group.exchange(self.rank, (tag, tensor))
        parts: list[Tensor] = []
        for rank, item in enumerate(posted):
            assert isinstance(item, tuple), f"rank {rank} posted {type(item)} to all_gather"
            other_tag, other = item
            if other.shape != tensor.shape or other.dtype != tensor.dtype:
                raise ValueError(
                    f"all_gather({tag!r}) needs the same shape and dtype on every rank, got "
                    f"{tuple(tensor.shape)} {tensor.dtype} on rank {self.rank} and "
                    f"{tuple(other.shape)} {other.dtype} (tag {other_tag!r}) on rank {rank}"
                )
            parts.append(other.to(tensor.device))
        return torch.stack(parts)

    def all_gather_async(self, tensor: Tensor, tag: str, out: Tensor | None = None) -> GatherHandle:
        """See ``Communicator.all_gather_async``; completes before it returns (threads
        rendezvous on every collective)."""
        gathered = self.all_gather(tensor, tag)
        if out is None:
            return GatherHandle(None, gathered, tensor.dtype, tensor)
        raw = tensor.dtype.is_floating_point and tensor.dtype.itemsize == 1
        if raw:
            out.view(torch.uint8).copy_(gathered.view(torch.uint8))
        else:
            out.copy_(gathered)
        return GatherHandle(None, out, tensor.dtype, tensor)

    def barrier(self) -> None:
        """See ``Communicator.barrier``."""
        self.group.exchange(self.rank, None)

    def all_gather_ints(self, values: Sequence[int]) -> list[tuple[int, ...]]:
        """See ``Communicator.all_gather_ints``."""
        return [cast(tuple[int, ...], v) for v in self.group.exchange(self.rank, tuple(values))]

    def gather_bytes(self, data: bytes) -> list[bytes] | None:
        """See ``Communicator.gather_bytes``."""
        gathered = self.group.exchange(self.rank, bytes(data))
        return [cast(bytes, item) for item in gathered] if self.rank == 0 else None

    def broadcast_bytes(self, data: bytes | None) -> bytes:
        """See ``Communicator.broadcast_bytes``."""
        if self.rank == 0 and data is None:
            raise RuntimeError("broadcast_bytes: rank 0 must pass the bytes, got None")
        return cast(bytes, self.group.exchange(self.rank, data)[0])

    def gather_objects(self, obj: object) -> list[object] | None:
        """See ``Communicator.gather_objects``."""
        gathered = self.group.exchange(self.rank, obj)
        return gathered if self.rank == 0 else None

    def broadcast_object(self, obj: object) -> object:
        """See ``Communicator.broadcast_object``."""
        return self.group.exchange(self.rank, obj)[0]


def run_local(
    world_size: int, fn: Callable[[Communicator], T], timeout_s: float | None = 120.0
) -> list[T]:
    """Runs ``fn(comm)`` on every rank of a new ``LocalGroup``, one thread per rank.

    Returns:
        Every rank's result, in rank order.

    Raises:
        RuntimeError: A rank raised; names the first rank that failed (other than by the
            broken rendezvous that failure causes), chained to its exception.
    """
    group = LocalGroup(world_size, timeout_s=timeout_s)
    results: list[T | None] = [None] * world_size
    errors: list[tuple[int, BaseException]] = []
    lock = threading.Lock()

    def body(comm: LocalCommunicator) -> None:
        try:
            results[comm.rank] = fn(comm)
        except BaseException as exc:
            with lock:
                errors.append((comm.rank, exc))
            group.abort()

    threads = [
        threading.Thread(target=body, args=(c,), name=f"cpkv-local-rank{c.rank}", daemon=True)
        for c in group.communicators()
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        primary = [e for e in errors if not isinstance(e[1], threading.BrokenBarrierError)]
        rank, exc = (primary or errors)[0]
        raise RuntimeError(f"local rank {rank} failed: {type(exc).__name__}: {exc}") from exc
    return cast(list[T], results)
