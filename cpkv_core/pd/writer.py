"""A prefill rank's writes: pieces packed side by side in one staging buffer, sent in one call.

Pieces wait until enough bytes are pending (``min_write_bytes``) or a request needs its
pieces landed (its final chunk, a retry); a flush then packs every pending piece into the
staging buffer (registered once per process) and sends them in as few
``batch_transfer_sync_write`` calls as the buffer allows: one call, one entry per piece.
When a call fails, its pieces are written one by one so the failure is pinned to the
requests whose writes the engine rejects.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor

from cpkv_core.pd.pack import pack_rows
from cpkv_core.pd.protocol import Piece
from cpkv_core.pd.transport import TransferError, Transport, Write


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One piece waiting to be written."""

    rid: str
    rows: npt.NDArray[np.int64]
    """``[tokens]`` the sender pool's rows, in block order."""
    dst: int
    """Destination address in the decode server's receive slab."""
    session: str
    piece: Piece


@dataclass(slots=True)
class WriteStats:
    """What one rank's writes cost over a run."""

    calls: int = 0
    """``batch_transfer_sync_write`` calls (a failed call's one-by-one retries included)."""
    seconds: float = 0.0
    """Packing plus writing, summed."""
    bytes: int = 0
    """Bytes that landed."""
    spans: list[tuple[float, float]] = field(default_factory=list)
    """(start, end) ``time.perf_counter`` of every flush: one clock for every process of a
    host, so the spans of a group's ranks can be merged."""
    flush_bytes: list[int] = field(default_factory=list)
    """Bytes that landed in each flush, in the order of ``spans``."""


class PieceWriter:
    """Queues pieces and writes them in large calls; see the module docstring."""

    def __init__(
        self,
        transport: Transport,
        views: Sequence[Tensor],
        staging: Tensor,
        capacity: int,
        min_write_bytes: int,
    ) -> None:
        self.transport = transport
        self.views = views
        self.token_bytes = sum(int(view.shape[1]) for view in views)
        self.staging = staging
        self.capacity = capacity
        self.min_write_bytes = min_write_bytes
        self.pending: list[Outgoing] = []
        self.stats = WriteStats()

    @property
    def pending_bytes(self) -> int:
        """Bytes queued and not yet written."""
        return sum(len(out.rows) for out in self.pending) * self.token_bytes

    @property
    def due(self) -> bool:
        """Enough bytes are queued for a write."""
        return bool(self.pending) and self.pending_bytes >= self.min_write_bytes

    def add(self, outgoing: Outgoing) -> None:
        """Queues one piece (its rows must stay unchanged until the next flush)."""
        assert len(outgoing.rows) * self.token_bytes <= self.capacity, outgoing.piece
        self.pending.append(outgoing)

    def flush(self) -> tuple[list[Outgoing], dict[str, str]]:
        """Writes every queued piece.

        Returns:
            (the pieces that landed, why each request whose write failed failed).
        """
        landed: list[Outgoing] = []
        failed: dict[str, str] = {}
        began = time.perf_counter()
        for group in self._groups():
            ok, errors = self._write_group(group)
            landed += ok
            failed.update(errors)
        self.pending.clear()
        end = time.perf_counter()
        self.stats.seconds += end - began
        self.stats.spans.append((began, end))
        nbytes = sum(len(out.rows) for out in landed) * self.token_bytes
        self.stats.flush_bytes.append(nbytes)
        self.stats.bytes += nbytes
        return landed, failed

    def _groups(self) -> list[list[Outgoing]]:
        """Consecutive pending pieces of one session that fit the staging buffer together."""
        groups: list[list[Outgoing]] = []
        used = 0
        for out in self.pending:
            nbytes = len(out.rows) * self.token_bytes
            fits = groups and used + nbytes <= self.capacity
            if fits and groups[-1][0].session == out.session:
                groups[-1].append(out)
                used += nbytes
            else:
                groups.append([out])
                used = nbytes
        return groups

    def _write_group(self, group: list[Outgoing]) -> tuple[list[Outgoing], dict[str, str]]:
        writes, offset = [], 0
        for out in group:
            nbytes = len(out.rows) * self.token_bytes
            block = self.staging[offset : offset + nbytes]
            pack_rows(self.views, torch.from_numpy(out.rows), block)
            writes.append(Write(block.data_ptr(), out.dst, nbytes))
            offset += nbytes
        session = group[0].session
        self.stats.calls += 1
        try:
            self.transport.write(session, writes)
            return group, {}
        except TransferError:
            pass
        # NOTE: the engine names no piece when a call fails: write them one by one.
        landed, failed = [], {}
        for out, write in zip(group, writes, strict=True):
            self.stats.calls += 1
            try:
                self.transport.write(session, [write])
                landed.append(out)
            except TransferError as exc:
                failed[out.rid] = str(exc)
        return landed, failed
