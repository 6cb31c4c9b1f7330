"""The PD decode server: a non-CP process that rebuilds full requests from CP prefill ranks.

It owns a paged pool, an allocator and page tables (one full copy, no CP). For each request
attempt it allocates pages and a receive slab (registered memory) the prefill ranks write
their packed pieces into, and marks the attempt ready only when every rank has reported its
pieces landed, the pieces cover every page position exactly once and tile the slab; it then
unpacks them into its pool by page position, and only then does it acknowledge. A rank's failure, a
timeout or a missing page fails the attempt: its pages are released once no sender can
still write into them (nothing else in the pool changes) and the request can be retried as
a new attempt on fresh pages. A ready request can run one
decode step of the model on the rebuilt KV.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, TypeAlias

import numpy as np
import torch

from cpkv_core.config import IndexKDtype, ModelConfig
from cpkv_core.dist.typed import encode_frame
from cpkv_core.pd.attempt import Attempt, AttemptState
from cpkv_core.pd.control import ControlServer
from cpkv_core.pd.decode_report import request_report
from cpkv_core.pd.pack import row_bytes, row_views
from cpkv_core.pd.protocol import (
    Alloc,
    AllocReply,
    Await,
    Done,
    ErrorReply,
    Fail,
    Probe,
    ProbeEnd,
    ProbeReply,
    Report,
    ReportReply,
    Verdict,
)
from cpkv_core.pd.receive import ArenaFullError, ReceiveArena, tiling_error, unpack_pieces
from cpkv_core.pd.transport import LOOPBACK, Transport
from cpkv_core.pd.wire import Message
from cpkv_core.planning import BatchSpec, RequestSpec, Scheduler
from cpkv_core.runtime.reference import ReferenceModel


class DecodeServer(ControlServer):
    """Serves ``pd_protocol`` messages on a listener bound to ``host``; see the module docstring.

    Invariant: a request is READY only if every sender reported Done, the reported page
    positions are exactly ``0..pages-1`` and the pieces tile the attempt's slab; a FAILED
    attempt's pages and slab are freed only once every sender has settled (Done, Fail or
    Await), and a retry always gets fresh pages and a fresh slab.
    """

    def __init__(
        self,
        cfg: ModelConfig,
        page_size: int,
        index_k_dtype: IndexKDtype,
        num_pages: int,
        timeout_s: float,
        authkey: bytes,
        die_on_done_of: str | None = None,
        host: str = LOOPBACK,
    ) -> None:
        """Args:
        die_on_done_of: fault injection: exit the process hard when a Done for this rid
            arrives (a decode server killed mid-transfer).
        host: The address (or host name) the control listener and the transfer engine
            bind and announce (``--pd-host``); one interface, never all of them.
        """
        super().__init__(host, authkey)
        self.model = ReferenceModel(cfg, num_pages, page_size, index_k_dtype)
        self.scheduler = Scheduler(num_pages, page_size)
        """The decode server's own scheduler: it is a separate, non-CP server."""
        self.timeout_s = timeout_s
        self.die_on_done_of = die_on_done_of
        self.transport = Transport(host)
        self.views = row_views(self.model.pool)
        """The pool as ``[rows, row_bytes]`` uint8 views, in packed-block order."""
        self.token_bytes = sum(row_bytes(self.views))
        # NOTE: twice the pool, so slabs of attempts in flight fit despite fragmentation.
        self.arena = ReceiveArena(2 * num_pages * page_size * self.token_bytes, self.transport)
        self.probes: dict[int, torch.Tensor] = {}
        """Scratch buffers of ``Probe`` by address (bench only)."""
        self.cond = threading.Condition()
        self.attempts: dict[str, Attempt] = {}
        """The latest attempt of every rid."""
        self.every_attempt: dict[tuple[str, int], Attempt] = {}
        """Every attempt, older failed ones included (their pages may be quarantined)."""
        self.history: dict[str, list[str]] = {}
        self.decoded: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        """Decode-step outputs (last hidden, logits) of ready requests, computed once."""

    def serve_forever(self) -> None:
        """Serves until a Shutdown arrives, then closes the transfer engine."""
        super().serve_forever()
        self.transport.close()

    def _dispatch(self, message: Message | None) -> Message | None:
        """The reply to one request (``ErrorReply`` for a message that is not a request)."""
        handlers: dict[type, Callable[[Any], Message | None]] = {
            Alloc: self._on_alloc,
            Done: self._on_done,
            Await: self._on_await,
            Fail: self._on_fail,
            Report: self._on_report,
            Probe: self._on_probe,
            ProbeEnd: self._on_probe_end,
        }
        handler = handlers.get(type(message))
        if handler is None:
            return ErrorReply(f"{type(message).__name__} is not a request to the decode server")
        return handler(message)

    def _on_alloc(self, msg: Alloc) -> AllocReply | ErrorReply:
        with self.cond:
            current = self.attempts.get(msg.rid)
            if current is not None and current.attempt == msg.attempt:
                if current.state is AttemptState.FAILED:
                    return ErrorReply(f"{msg.rid} attempt {msg.attempt} failed: {current.reason}")
                return self._alloc_reply(current)
            if current is not None and current.attempt > msg.attempt:
                return ErrorReply(f"{msg.rid}: attempt {msg.attempt} is stale")
            if current is not None:
                self._await_verdict(current)
            if current is not None and current.state is not AttemptState.FAILED:
                return ErrorReply(f"{msg.rid} is {current.state}; only a failed request is retried")
            key = Attempt(msg.rid, msg.attempt, 0, 0, 0, 0).key
            self.scheduler.schedule(BatchSpec(0, (RequestSpec(key, 0, msg.seq_len),)))
            try:
                self.arena.alloc(key, msg.seq_len * self.token_bytes)
            except ArenaFullError as exc:
                self.scheduler.release(key)
                return ErrorReply(f"{msg.rid}: {exc}")
            attempt = Attempt(
                msg.rid,
                msg.attempt,
                msg.seq_len,
                msg.next_token,
                msg.senders,
                len(self.scheduler.page_table(key)),
            )
            self.attempts[msg.rid] = attempt
            self.every_attempt[msg.rid, msg.attempt] = attempt
            return self._alloc_reply(attempt)

    def _alloc_reply(self, attempt: Attempt) -> AllocReply:
        offset, _ = self.arena.slab(attempt.key)
        return AllocReply(
            attempt.rid,
            attempt.attempt,
            self.transport.session,
            tuple(self.scheduler.page_table(attempt.key).tolist()),
            self.arena.address + offset,
            row_bytes(self.views),
        )

    def _attempt(self, rid: str, number: int) -> Attempt | None:
        return self.every_attempt.get((rid, number))

    def _fail(self, attempt: Attempt, reason: str) -> None:
        """Fails a pending attempt; the caller holds the lock. Its pages stay quarantined
        until every sender has settled, so a late write can never land in reused pages."""
        if attempt.state is not AttemptState.PENDING:
            return
        attempt.state = AttemptState.FAILED
        attempt.reason = reason
        self.history.setdefault(attempt.rid, []).append(f"attempt {attempt.attempt}: {reason}")
        self._release_if_settled(attempt)
        self.cond.notify_all()

    def _settle(self, attempt: Attempt, rank: int) -> None:
        if attempt.deadline is None:
            attempt.deadline = time.monotonic() + self.timeout_s
        attempt.settled.add(rank)
        self._release_if_settled(attempt)

    def _release_if_settled(self, attempt: Attempt) -> None:
        """Frees a failed attempt's pages and slab once no sender can write into them."""
        settled = attempt.settled >= set(range(attempt.senders))
        if attempt.state is AttemptState.FAILED and not attempt.released and settled:
            self.scheduler.release(attempt.key)
            self.arena.free(attempt.key)
            attempt.released = True

    def _on_fail(self, msg: Fail) -> Verdict:
        with self.cond:
            attempt = self._attempt(msg.rid, msg.attempt)
            if attempt is None:
                return Verdict(msg.rid, msg.attempt, False, "unknown attempt")
            self._fail(attempt, f"rank {msg.rank}: {msg.reason}")
            self._settle(attempt, msg.rank)
            return Verdict(msg.rid, msg.attempt, False, attempt.reason)

    def _on_done(self, msg: Done) -> None:
        if msg.rid == self.die_on_done_of:
            os._exit(17)
        with self.cond:
            attempt = self._attempt(msg.rid, msg.attempt)
            if attempt is None:
                return
            if attempt.state is AttemptState.PENDING:
                attempt.done[msg.rank] = msg.pieces
                if len(attempt.done) == attempt.senders:
                    self._complete(attempt)
            self._settle(attempt, msg.rank)

    def _on_await(self, msg: Await) -> Verdict:
        with self.cond:
            attempt = self._attempt(msg.rid, msg.attempt)
            if attempt is None:
                return Verdict(msg.rid, msg.attempt, False, "unknown attempt")
            self._settle(attempt, msg.rank)
            self._await_verdict(attempt)
            return Verdict(
                msg.rid, msg.attempt, attempt.state is AttemptState.READY, attempt.reason
            )

    def _await_verdict(self, attempt: Attempt) -> None:
        """Waits until ``attempt`` is ready or failed (the caller holds the lock; waiting
        releases it); fails it at its deadline, naming the ranks that never reported."""
        while attempt.state is AttemptState.PENDING:
            if attempt.deadline is None:
                attempt.deadline = time.monotonic() + self.timeout_s
            remaining = attempt.deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(set(range(attempt.senders)) - set(attempt.done))
                self._fail(
                    attempt, f"timed out after {self.timeout_s:g}s waiting for ranks {missing}"
                )
            else:
                self.cond.wait(remaining)

    def _complete(self, attempt: Attempt) -> None:
        """Every sender reported: ready iff the pieces cover every page exactly once and tile
        the slab; then they are unpacked into the pool by page position."""
        pieces = [piece for rank_pieces in attempt.done.values() for piece in rank_pieces]
        covered = sorted(p for piece in pieces for p in piece.positions)
        if covered != list(range(attempt.pages)):
            self._fail(
                attempt, f"pieces cover positions {covered}, need 0..{attempt.pages - 1} once"
            )
            return
        offset, nbytes = self.arena.slab(attempt.key)
        ps = self.model.page_size
        tiling = tiling_error(pieces, nbytes, attempt.seq_len, ps, self.token_bytes)
        if tiling:
            self._fail(attempt, tiling)
            return
        first_rows = self.scheduler.page_table(attempt.key).astype(np.int64) * ps
        slab = self.arena.buffer[offset : offset + nbytes]
        unpack_pieces(self.views, slab, pieces, first_rows, attempt.seq_len, ps)
        self.arena.free(attempt.key)
        attempt.state = AttemptState.READY
        self.cond.notify_all()

    def _on_probe(self, msg: Probe) -> ProbeReply:
        scratch = torch.zeros(msg.nbytes, dtype=torch.uint8)
        self.transport.register([scratch])
        with self.cond:
            self.probes[scratch.data_ptr()] = scratch
        return ProbeReply(self.transport.session, scratch.data_ptr())

    def _on_probe_end(self, msg: ProbeEnd) -> None:
        with self.cond:
            scratch = self.probes.pop(msg.address, None)
        if scratch is not None:
            self.transport.unregister(scratch)

    def _on_report(self, _: Report) -> ReportReply:
        with self.cond:
            reports = [
                request_report(attempt, self.model, self.scheduler, self.decoded, self.history)
                for attempt in self.attempts.values()
            ]
            return ReportReply(tuple(reports), self.scheduler.allocator.num_free_pages)


Started: TypeAlias = tuple[tuple[str, int], str]
"""What a decode process reports to its parent once it listens: its control address and
its Mooncake session."""


def serve_decode(
    cfg: ModelConfig,
    page_size: int,
    index_k_dtype: IndexKDtype,
    num_pages: int,
    timeout_s: float,
    authkey: bytes,
    started: Connection,
    die_on_done_of: str | None = None,
    host: str = LOOPBACK,
) -> None:
    """Process entry point: builds the server on ``host``, reports its addresses on the
    pipe ``started`` (a typed frame of ``Started``, never a pickle), serves."""
    torch.set_num_threads(1)
    server = DecodeServer(
        cfg, page_size, index_k_dtype, num_pages, timeout_s, authkey, die_on_done_of, host
    )
    started.send_bytes(encode_frame((server.address, server.transport.session), Started))
    started.close()
    server.serve_forever()
