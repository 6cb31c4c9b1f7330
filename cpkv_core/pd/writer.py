"""A prefill rank's writes: pieces packed side by side in a staging buffer, sent in one call
on a writer thread, while the rank computes its next batch.

Pieces wait until enough bytes are pending (``min_write_bytes``) or a request needs its
pieces landed (its final chunk, a retry). A flush packs every pending piece (on the calling
thread, before the next batch can overwrite or roll back pool rows) into one of two
registered staging buffers, destination by destination (one call reaches one decode rank),
and hands the write to the writer thread, which sends it in one
``batch_transfer_sync_write`` call (the engine releases the GIL while it runs). Pieces
that continue each other in the staging buffer and in the destination slab go as one
descriptor (``planning.pd_reshard.merge_runs``). Packing
waits only when both buffers are still in flight. When a call fails, its pieces are
written one by one so the failure is pinned to the requests whose writes the engine
rejects. With ``overlap`` off the flush writes on the calling thread, as before.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from torch import Tensor

from cpkv_core.pd.pack import pack_index, pack_rows
from cpkv_core.pd.transport import TransferError, Write
from cpkv_core.pd.writes import Outgoing, WriteStats, merge_writes


class Sink(Protocol):
    """What the writer tells its sender; called on the writer thread, in submission order."""

    def skip(self, out: Outgoing) -> bool:
        """The piece's attempt failed (or the peer is gone): do not write it."""
        ...

    def written(self, landed: list[Outgoing], failed: dict[str, str], batch: int) -> None:
        """One write's outcome: the pieces that landed, why each failed request failed."""
        ...

    def settled(self, rids: tuple[str, ...]) -> None:
        """Every piece of ``rids`` flushed so far has been written (or skipped)."""
        ...


class Writes(Protocol):
    """The transport's write (``transport.Transport``, or a fake in a unit test)."""

    def write(self, session: str, writes: Sequence[Write]) -> None: ...


@dataclass(frozen=True, slots=True)
class _Job:
    """One staging buffer's write (``buffer`` set), or a request's final mark (``finals``)."""

    batch: int
    buffer: int | None = None
    group: tuple[Outgoing, ...] = ()
    writes: tuple[Write, ...] = ()
    finals: tuple[str, ...] = ()


class PieceWriter:
    """Queues pieces and writes them in large calls; see the module docstring.

    Invariant: jobs run one at a time, in submission order, on one thread (the writer
    thread, or the caller with overlap off), and ``Sink.skip`` is asked right before each
    piece is written; so once ``Sink.written`` reported a request failed, no later piece
    of it is written. A staging buffer is packed only when no write from it is in flight.
    """

    def __init__(
        self,
        transport: Writes,
        views: Sequence[Tensor],
        staging: Sequence[Tensor],
        capacity: int,
        min_write_bytes: int,
        sink: Sink,
        overlap: bool = True,
    ) -> None:
        """Args:
        staging: two registered buffers of at least ``capacity`` bytes (uint8).
        overlap: write on a writer thread; False: on the caller's thread.
        """
        assert all(buf.numel() >= capacity for buf in staging), (len(staging), capacity)
        self.transport = transport
        self.views = views
        self.token_bytes = sum(int(view.shape[1]) for view in views)
        self.staging = tuple(staging)
        self.capacity = capacity
        self.min_write_bytes = min_write_bytes
        self.sink = sink
        self.overlap = overlap
        self.pending: list[Outgoing] = []
        self.stats = WriteStats()
        self._stats_lock = threading.Lock()
        self._free: queue.Queue[int] = queue.Queue()
        for index in range(len(self.staging)):
            self._free.put(index)
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        """An unexpected exception the writer thread hit, re-raised on the caller's thread."""

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

    def flush(self, batch: int, finals: tuple[str, ...] = ()) -> None:
        """Packs every queued piece and hands the writes over; then marks ``finals`` settled
        once those writes are done. Returns once packed (with overlap off: once written).

        Raises:
            BaseException: what the writer thread hit since the last flush.
        """
        self._raise()
        for group in self._groups():
            began = time.perf_counter()
            index = self._free.get()  # NOTE: blocks only while both buffers are in flight
            packing = time.perf_counter()
            if self.overlap:  # NOTE: off, nothing is ever in flight here: exposed == seconds
                with self._stats_lock:
                    self.stats.exposed_seconds += packing - began
            writes, offset = [], 0
            for out in group:
                nbytes = len(out.rows) * self.token_bytes
                block = self.staging[index][offset : offset + nbytes]
                pack_rows(self.views, pack_index(out.rows, self.views[0].device), block)
                writes.append(Write(block.data_ptr(), out.dst, nbytes))
                offset += nbytes
            packed = time.perf_counter() - packing
            with self._stats_lock:
                self.stats.seconds += packed
                self.stats.exposed_seconds += packed
            self._submit(_Job(batch, index, tuple(group), tuple(writes)))
        self.pending.clear()
        if finals:
            self._submit(_Job(batch, finals=finals))

    def drain(self) -> None:
        """Waits until every handed-over write is done (counted as exposed time).

        Raises:
            BaseException: what the writer thread hit.
        """
        if self._thread is not None:
            began = time.perf_counter()
            self._jobs.join()
            waited = time.perf_counter() - began
            with self._stats_lock:
                self.stats.exposed_seconds += waited
                self.stats.drain_seconds += waited
        self._raise()

    def close(self) -> None:
        """Drains and stops the writer thread (a later flush starts a new one)."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None
        self._raise()

    def _raise(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _submit(self, job: _Job) -> None:
        if not self.overlap:
            self._run(job)
            self._raise()
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="pd-writer", daemon=True)
            self._thread.start()
        self._jobs.put(job)

    def _loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            self._run(job)
            self._jobs.task_done()
        self._jobs.task_done()

    def _run(self, job: _Job) -> None:
        """One job: write (unless an earlier job failed unexpectedly), free its buffer."""
        try:
            if self._error is None:
                if job.buffer is not None:
                    self._write_job(job)
                if job.finals:
                    self.sink.settled(job.finals)
        except BaseException as exc:  # NOTE: surfaced on the caller's thread, never lost
            self._error = exc
        finally:
            if job.buffer is not None:
                self._free.put(job.buffer)

    def _write_job(self, job: _Job) -> None:
        began = time.perf_counter()
        pairs = [
            (o, w) for o, w in zip(job.group, job.writes, strict=True) if not self.sink.skip(o)
        ]
        landed, failed = self._write_group(pairs)
        end = time.perf_counter()
        nbytes = sum(len(out.rows) for out in landed) * self.token_bytes
        with self._stats_lock:
            self.stats.seconds += end - began
            if not self.overlap:
                self.stats.exposed_seconds += end - began
            self.stats.spans.append((began, end))
            self.stats.flush_bytes.append(nbytes)
            self.stats.bytes += nbytes
        self.sink.written(landed, failed, job.batch)

    def _groups(self) -> list[list[Outgoing]]:
        """The pending pieces, destination by destination (in queue order within one), in
        groups of one session that fit a staging buffer together."""
        groups: list[list[Outgoing]] = []
        used = 0
        for out in sorted(self.pending, key=lambda o: o.dest):
            nbytes = len(out.rows) * self.token_bytes
            fits = groups and used + nbytes <= self.capacity
            if fits and groups[-1][0].session == out.session:
                groups[-1].append(out)
                used += nbytes
            else:
                groups.append([out])
                used = nbytes
        return groups

    def _write_group(
        self, pairs: list[tuple[Outgoing, Write]]
    ) -> tuple[list[Outgoing], dict[str, str]]:
        if not pairs:
            return [], {}
        session = pairs[0][0].session
        merged = merge_writes([w for _, w in pairs])
        with self._stats_lock:
            self.stats.calls += 1
            self.stats.descriptors += len(merged)
        try:
            self.transport.write(session, merged)
            return [o for o, _ in pairs], {}
        except TransferError:
            pass
        # NOTE: the engine names no piece when a call fails: write them one by one.
        landed, failed = [], {}
        for out, write in pairs:
            if out.rid in failed:
                continue
            with self._stats_lock:
                self.stats.calls += 1
                self.stats.descriptors += 1
            try:
                self.transport.write(session, [write])
                landed.append(out)
            except TransferError as exc:
                failed[out.rid] = str(exc)
        return landed, failed
