"""What every layer above talks to: a group of ranks and its collectives (``Communicator``).

``comm.TorchDistCommunicator`` (a real torch.distributed group) and
``local_group.LocalGroup`` (in-process threads) implement it; this module imports no
``torch.distributed``, so the protocol stays apart from the one module that does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
from torch import Tensor

from cpkv_core.dist.stats import CommStats

__all__ = ["Communicator", "GatherHandle", "InFlight"]


class InFlight(Protocol):
    """A collective started with ``async_op=True`` (torch.distributed's ``Work``)."""

    def wait(self) -> object:
        """Blocks until the collective completes."""
        ...


class GatherHandle:
    """An all-gather in flight: ``wait()`` blocks until it completes and returns its result.

    Holds the input and output tensors until then, so neither is freed under the transfer.
    """

    def __init__(
        self, work: InFlight | None, out: Tensor, dtype: torch.dtype, wire: Tensor
    ) -> None:
        self._work, self._out, self._dtype, self._wire = work, out, dtype, wire

    def wait(self) -> Tensor:
        """``[world_size, *shape]``, row ``r`` from rank ``r`` (the ``out`` given, if any)."""
        if self._work is not None:
            self._work.wait()
            self._work = None
        out = self._out
        return out.view(self._dtype) if out.dtype != self._dtype else out


class Communicator(Protocol):
    """Collectives over one group of ranks; ``rank`` and ``world_size`` are group-local."""

    rank: int
    world_size: int
    stats: CommStats

    def all_gather(self, tensor: Tensor, tag: str) -> Tensor:
        """Gathers every rank's ``tensor`` and counts the bytes under ``tag``.

        Args:
            tensor: ``[*shape]``, same shape and dtype on every rank.
            tag: Name the bytes are counted under (e.g. ``"kv_write"``).

        Returns:
            A new tensor ``[world_size, *shape]``, row ``r`` from rank ``r``.
        """
        ...

    def all_gather_async(self, tensor: Tensor, tag: str, out: Tensor | None = None) -> GatherHandle:
        """Starts ``all_gather(tensor, tag)`` and returns at once with its handle; every rank
        issues its async gathers in the same order. ``out`` (``[world_size, *shape]``,
        contiguous) receives the result in place; None allocates it. An in-process group
        may complete the gather before returning."""
        ...

    def barrier(self) -> None:
        """Blocks until every rank of the group arrives."""
        ...

    def all_gather_ints(self, values: Sequence[int]) -> list[tuple[int, ...]]:
        """Every rank's few ``values`` (as many on every rank), on every rank, in rank order.

        Not counted in ``stats``: a vote on a batch's fate (``runtime.failures``), not KV.
        """
        ...

    def gather_bytes(self, data: bytes) -> list[bytes] | None:
        """Collects every rank's ``data`` (lengths may differ): the list on rank 0, None
        elsewhere. Plain bytes, never unpickled: results travel as typed frames.

        Not counted in ``stats``: use it for results and reports, not for KV.
        """
        ...

    def broadcast_bytes(self, data: bytes | None) -> bytes:
        """Rank 0's ``data`` on every rank (the other ranks pass None).

        Not counted in ``stats``: it carries host metadata (a scheduled batch), not KV.
        """
        ...

    def gather_objects(self, obj: object) -> list[object] | None:
        """Collects a picklable ``obj`` from every rank: the list on rank 0, None elsewhere.

        It unpickles what peers send: only for peer-read handles between the ranks of one
        host (``runtime.shared_pools``), never for results or anything that crosses a host.
        """
        ...

    def broadcast_object(self, obj: object) -> object:
        """Rank 0's picklable ``obj`` on every rank (other ranks pass anything, e.g. None).

        It unpickles what rank 0 sends: the same restriction as ``gather_objects``.
        """
        ...
