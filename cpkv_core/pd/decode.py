"""A PD decode rank: rebuilds the page positions it owns of every request from the prefill
ranks' pieces.

Rank ``b`` of a decode group of ``dcp_size`` owns positions ``j % dcp_size == b``
(``planning.pd_reshard``; ``dcp_size`` 1 is the non-CP decode server) and has its own
scheduler, pool, control listener and transfer engine. A prefill rank first exchanges
layouts with it (``Hello``: a mismatch refuses every transfer, naming both). Per attempt it
allocates pages for its positions and a receive slab (registered memory) every prefill rank
writes its pieces for it into; the attempt completes only when every prefill rank reported
its pieces landed and they cover its positions exactly once and tile the slab; they are
then unpacked into its pool by page position, and only then does it acknowledge. A failure,
a timeout or a missing page fails the attempt: its pages go back once no sender can still
write into them (nothing else in the pool changes) and a retry is a new attempt on fresh
pages. A request is ready when every decode rank completed the same attempt; a ``Fail`` for
a completed attempt (another decode rank failed it) releases it. ``Report`` runs the decode
step of every ready request, on every rank of the group at once (``decode_report``).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from cpkv_core.dist import Communicator
from cpkv_core.pd.attempt import Attempt, AttemptState
from cpkv_core.pd.control import ControlServer
from cpkv_core.pd.decode_group import DecodeSpec
from cpkv_core.pd.decode_report import agreed_ready, decode_request, request_report
from cpkv_core.pd.layout import layout_mismatch, pool_layout
from cpkv_core.pd.pack import row_bytes, row_views
from cpkv_core.pd.probe import ProbeScratch
from cpkv_core.pd.protocol import (
    Alloc,
    AllocReply,
    Await,
    Done,
    ErrorReply,
    Fail,
    Hello,
    HelloReply,
    Probe,
    ProbeEnd,
    Report,
    ReportReply,
    Verdict,
)
from cpkv_core.pd.receive import ArenaFullError, ReceiveArena, Shard, rebuild
from cpkv_core.pd.transport import LOOPBACK, Transport
from cpkv_core.pd.wire import Message
from cpkv_core.planning import BatchSpec, RequestSpec, Scheduler
from cpkv_core.planning.pd_reshard import decode_tokens
from cpkv_core.runtime.reference import ReferenceModel


class DecodeServer(ControlServer, ProbeScratch):
    """Serves ``pd_protocol`` messages on a listener bound to ``host``; see the module docstring.

    Invariant: an attempt is READY only if every sender reported Done, the reported page
    positions are exactly this rank's and the pieces tile the attempt's slab; a FAILED
    attempt's pages and slab are freed only once every sender has settled (Done, Fail or
    Await), and a retry always gets fresh pages and a fresh slab.
    """

    def __init__(
        self,
        spec: DecodeSpec,
        authkey: bytes,
        comm: Communicator | None = None,
        die_on_done_of: str | None = None,
        host: str = LOOPBACK,
        transport: Transport | None = None,
    ) -> None:
        """Args:
        comm: the decode group (``spec.dcp_size`` ranks), for the decode step's merge;
            None for a non-CP decode server.
        die_on_done_of: fault injection: exit the process hard when a Done for this rid
            arrives (a decode server killed mid-transfer).
        host: The address (or host name) the control listener and the transfer engine
            bind and announce (``--pd-host``); one interface, never all of them.
        transport: the transfer engine to receive on; None starts one on ``host`` (a
            process's decode server has its own; in-process tests may share one).
        """
        size = 1 if comm is None else comm.world_size
        assert size == spec.dcp_size, f"a decode group of {size} ranks for {spec}"
        super().__init__(host, authkey)
        self.spec = spec
        self.comm = comm
        self.dcp_rank = 0 if comm is None else comm.rank
        self.model = ReferenceModel(spec.model, spec.num_pages, spec.page_size, spec.index_k_dtype)
        self.scheduler = Scheduler(spec.num_pages, spec.page_size)
        """This rank's own scheduler: its pages, for the positions it owns."""
        self.layout = pool_layout(self.model.pool, spec.prefill_cp_size, spec.dcp_size)
        self.timeout_s = spec.timeout_s
        self.die_on_done_of = die_on_done_of
        self.transport = transport or Transport(host)
        self.views = row_views(self.model.pool)
        """The pool as ``[rows, row_bytes]`` uint8 views, in packed-block order."""
        self.token_bytes = sum(row_bytes(self.views))
        # NOTE: twice the pool, so slabs of attempts in flight fit despite fragmentation.
        pool_bytes = spec.num_pages * spec.page_size * self.token_bytes
        self.arena = ReceiveArena(2 * pool_bytes, self.transport)
        ProbeScratch.__init__(self)
        self.cond = threading.Condition()
        self.reporting = threading.Lock()
        """Held for a whole ``Report``: its collectives run in one order on every rank."""
        self.attempts: dict[str, Attempt] = {}
        """The latest attempt of every rid."""
        self.every_attempt: dict[tuple[str, int], Attempt] = {}
        """Every attempt, older failed ones included (their pages may be quarantined)."""
        self.history: dict[str, list[str]] = {}
        self.errors: list[str] = []
        """Refused handshakes, each naming both layouts."""
        self.decoded: dict[str, tuple[torch.Tensor, ...]] = {}
        """Decode-step outputs (last hidden, logits, top-k) by attempt key, computed once."""

    def serve_forever(self) -> None:
        """Serves until a Shutdown arrives, then closes."""
        super().serve_forever()
        self.close()

    def close(self) -> None:
        """Unregisters this server's memory and closes its listener."""
        self.transport.unregister(self.arena.buffer)
        self.close_probes()
        self.listener.close()

    def _dispatch(self, message: Message | None) -> Message | None:
        """The reply to one request (``ErrorReply`` for a message that is not a request)."""
        handlers: dict[type, Callable[[Any], Message | None]] = {
            Hello: self._on_hello,
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

    def _on_hello(self, msg: Hello) -> HelloReply:
        reason = layout_mismatch(msg.layout, self.layout, self.dcp_rank)
        if reason:
            with self.cond:
                self.errors.append(f"refused prefill rank {msg.rank}: {reason}")
        return HelloReply(self.dcp_rank, self.layout, reason)

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
            ps, size = self.spec.page_size, self.spec.dcp_size
            tokens = decode_tokens(msg.seq_len, ps, self.dcp_rank, size)
            attempt = Attempt(msg.rid, msg.attempt, msg.seq_len, msg.next_token, msg.senders, 0)
            if tokens:
                self.scheduler.schedule(BatchSpec(0, (RequestSpec(attempt.key, 0, tokens),)))
                attempt.pages = len(self.scheduler.page_table(attempt.key))
            try:
                self.arena.alloc(attempt.key, tokens * self.token_bytes)
            except ArenaFullError as exc:
                self.scheduler.release(attempt.key)
                return ErrorReply(f"{msg.rid}: {exc}")
            self.attempts[msg.rid] = attempt
            self.every_attempt[msg.rid, msg.attempt] = attempt
            return self._alloc_reply(attempt)

    def _table(self, attempt: Attempt) -> np.ndarray:
        """This rank's pages of the attempt, in position order (none when it owns none)."""
        if attempt.key not in self.scheduler:
            return np.zeros(0, dtype=np.int64)
        return np.asarray(self.scheduler.page_table(attempt.key), dtype=np.int64)

    def _alloc_reply(self, attempt: Attempt) -> AllocReply:
        offset, _ = self.arena.slab(attempt.key)
        return AllocReply(
            attempt.rid,
            attempt.attempt,
            self.transport.session,
            tuple(self._table(attempt).tolist()),
            self.arena.address + offset,
            row_bytes(self.views),
        )

    def _attempt(self, rid: str, number: int) -> Attempt | None:
        return self.every_attempt.get((rid, number))

    def _fail(self, attempt: Attempt, reason: str) -> None:
        """Fails a pending or complete attempt; the caller holds the lock. Its pages stay
        quarantined until every sender has settled, so a late write can never land in
        reused pages (a complete attempt's senders all have)."""
        if attempt.state is AttemptState.FAILED:
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
            if attempt.key in self.scheduler:
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
        """Every sender reported: ready iff the pieces cover this rank's positions exactly
        once and tile the slab; then they are unpacked into the pool by page position."""
        pieces = [piece for rank_pieces in attempt.done.values() for piece in rank_pieces]
        offset, nbytes = self.arena.slab(attempt.key)
        shard = Shard(self.spec.page_size, self.dcp_rank, self.spec.dcp_size)
        slab = self.arena.buffer[offset : offset + nbytes]
        error = rebuild(self.views, slab, pieces, attempt.seq_len, self._table(attempt), shard)
        if error:
            self._fail(attempt, error)
            return
        self.arena.free(attempt.key)
        attempt.state = AttemptState.READY
        self.cond.notify_all()

    def _on_report(self, _: Report) -> ReportReply:
        """Every request's state and rebuilt rows; first the decode step of every request
        each rank of the group completed (every rank must be asked at once)."""
        with self.reporting, self.cond:
            done = [a for a in self.attempts.values() if a.state is AttemptState.READY]
            ready = tuple(sorted((a.rid, a.attempt) for a in done))
            for rid, _number in agreed_ready(self.comm, ready):
                attempt = self.attempts[rid]
                if attempt.key not in self.decoded:
                    self.decoded[attempt.key] = decode_request(
                        attempt, self.model, self.scheduler, self.comm
                    )
            shard = (self.dcp_rank, self.spec.dcp_size)
            reports = [
                request_report(a, self.model, self.scheduler, self.decoded, self.history, shard)
                for a in self.attempts.values()
            ]
            free = self.scheduler.allocator.num_free_pages
            return ReportReply(tuple(reports), free, tuple(self.errors))
