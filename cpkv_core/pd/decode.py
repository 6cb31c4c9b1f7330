"""The PD decode server: a non-CP process that rebuilds full requests from CP prefill ranks.

It owns a paged pool, an allocator and page tables (one full copy, no CP). For each request
attempt it allocates pages, tells the prefill ranks where to write (registered memory), and
marks the attempt ready only when every rank has reported its pieces landed and the pieces
cover every page position exactly once; only then does it acknowledge. A rank's failure, a
timeout or a missing page fails the attempt: its pages are released once no sender can
still write into them (nothing else in the pool changes) and the request can be retried as
a new attempt on fresh pages. A ready request can run one
decode step of the model on the rebuilt KV.
"""

from __future__ import annotations

import io
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from multiprocessing.connection import Connection, Listener
from typing import Any

import torch

from cpkv_core.config import IndexKDtype, ModelConfig
from cpkv_core.pd.protocol import (
    Alloc,
    AllocReply,
    Await,
    Done,
    ErrorReply,
    Fail,
    Report,
    ReportReply,
    RequestReport,
    Shutdown,
    TensorTarget,
    Verdict,
)
from cpkv_core.pd.transport import LOOPBACK, Transport
from cpkv_core.planning import BatchSpec, RequestSpec, ScheduledRequest, Scheduler
from cpkv_core.runtime.reference import ReferenceModel


class AttemptState(StrEnum):
    """Where one transfer attempt stands."""

    PENDING = "pending"
    READY = "ready"
    FAILED = "failed"


@dataclass(slots=True)
class Attempt:
    """One attempt to receive a request; ``done`` maps rank -> positions it reported."""

    rid: str
    attempt: int
    seq_len: int
    next_token: int
    senders: int
    pages: int
    deadline: float
    state: AttemptState = AttemptState.PENDING
    reason: str = ""
    done: dict[int, tuple[int, ...]] = field(default_factory=dict)
    settled: set[int] = field(default_factory=set)
    """Senders that can no longer write into this attempt's pages (Done, Fail or Await)."""
    released: bool = False

    @property
    def key(self) -> str:
        """The attempt's name in the decode allocator: a retry never reuses its pages."""
        return f"{self.rid}#{self.attempt}"


def tensor_bytes(obj: object) -> bytes:
    """``torch.save`` to bytes (tensors, including fp8, pickle safely this way)."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


class DecodeServer:
    """Serves ``pd_protocol`` messages on a listener bound to ``host``; see the module docstring.

    Invariant: a request is READY only if every sender reported Done and the reported page
    positions are exactly ``0..pages-1``; a FAILED attempt's pages are freed only once every
    sender has settled (Done, Fail or Await), and a retry always gets fresh pages.
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
        self.model = ReferenceModel(cfg, num_pages, page_size, index_k_dtype)
        self.scheduler = Scheduler(num_pages, page_size)
        """The decode server's own scheduler: it is a separate, non-CP server."""
        self.timeout_s = timeout_s
        self.die_on_done_of = die_on_done_of
        self.transport = Transport(host)
        self.transport.register(
            [
                t
                for layer in self.model.pool.layers
                for t in (layer.latent, layer.index_k, layer.index_k_scale)
            ]
        )
        self.listener = Listener((host, 0), authkey=authkey)
        self.cond = threading.Condition()
        self.attempts: dict[str, Attempt] = {}
        """The latest attempt of every rid."""
        self.every_attempt: dict[tuple[str, int], Attempt] = {}
        """Every attempt, older failed ones included (their pages may be quarantined)."""
        self.history: dict[str, list[str]] = {}
        self.decoded: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        """Decode-step outputs (last hidden, logits) of ready requests, computed once."""
        self.stopped = threading.Event()

    @property
    def address(self) -> tuple[str, int]:
        """The control listener's (host, port)."""
        host, port = self.listener.address
        return str(host), int(port)

    def serve_forever(self) -> None:
        """Accepts connections, one thread each, until a Shutdown arrives."""
        threading.Thread(target=self._accept_loop, daemon=True).start()
        self.stopped.wait()
        self.transport.close()

    def _accept_loop(self) -> None:
        while not self.stopped.is_set():
            try:
                conn = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: Connection) -> None:
        handlers: dict[type, Callable[[Any], object]] = {
            Alloc: self._on_alloc,
            Done: self._on_done,
            Await: self._on_await,
            Fail: self._on_fail,
            Report: self._on_report,
        }
        with conn:
            while True:
                try:
                    message = conn.recv()
                except (EOFError, OSError):
                    return
                if isinstance(message, Shutdown):
                    conn.send(None)
                    self.stopped.set()
                    return
                handler = handlers.get(type(message))
                try:
                    reply = handler(message) if handler else ErrorReply(f"unknown {message!r}")
                except Exception as exc:
                    reply = ErrorReply(f"{type(exc).__name__}: {exc}")
                conn.send(reply)

    def _on_alloc(self, msg: Alloc) -> object:
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
            key = Attempt(msg.rid, msg.attempt, 0, 0, 0, 0, 0.0).key
            self.scheduler.schedule(BatchSpec(0, (RequestSpec(key, 0, msg.seq_len),)))
            attempt = Attempt(
                msg.rid,
                msg.attempt,
                msg.seq_len,
                msg.next_token,
                msg.senders,
                len(self.scheduler.page_table(key)),
                time.monotonic() + self.timeout_s,
            )
            self.attempts[msg.rid] = attempt
            self.every_attempt[msg.rid, msg.attempt] = attempt
            return self._alloc_reply(attempt)

    def _alloc_reply(self, attempt: Attempt) -> AllocReply:
        targets = tuple(
            tuple(
                TensorTarget(t.data_ptr(), t[0].numel() * t.element_size())
                for t in (layer.latent, layer.index_k, layer.index_k_scale)
            )
            for layer in self.model.pool.layers
        )
        return AllocReply(
            attempt.rid,
            attempt.attempt,
            self.transport.session,
            tuple(self.scheduler.page_table(attempt.key).tolist()),
            targets,
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
        attempt.settled.add(rank)
        self._release_if_settled(attempt)

    def _release_if_settled(self, attempt: Attempt) -> None:
        """Frees a failed attempt's pages once no sender can write into them any more."""
        settled = attempt.settled >= set(range(attempt.senders))
        if attempt.state is AttemptState.FAILED and not attempt.released and settled:
            self.scheduler.release(attempt.key)
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
                attempt.done[msg.rank] = msg.positions
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
            remaining = attempt.deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(set(range(attempt.senders)) - set(attempt.done))
                self._fail(
                    attempt, f"timed out after {self.timeout_s:g}s waiting for ranks {missing}"
                )
            else:
                self.cond.wait(remaining)

    def _complete(self, attempt: Attempt) -> None:
        """Every sender reported: ready iff the pieces cover every page exactly once."""
        covered = sorted(p for positions in attempt.done.values() for p in positions)
        if covered != list(range(attempt.pages)):
            self._fail(
                attempt, f"pieces cover positions {covered}, need 0..{attempt.pages - 1} once"
            )
            return
        attempt.state = AttemptState.READY
        self.cond.notify_all()

    def _on_report(self, _: Report) -> ReportReply:
        with self.cond:
            reports = [self._report(attempt) for attempt in self.attempts.values()]
            return ReportReply(tuple(reports), self.scheduler.allocator.num_free_pages)

    def _report(self, attempt: Attempt) -> RequestReport:
        history = "; ".join(self.history.get(attempt.rid, []))
        scheduler = self.scheduler
        pages = len(scheduler.page_table(attempt.key)) if attempt.key in scheduler else 0
        if attempt.state is not AttemptState.READY:
            state = history or f"attempt {attempt.attempt} {attempt.state}"
            return RequestReport(attempt.rid, False, state, pages)
        if attempt.rid not in self.decoded:
            step = RequestSpec(attempt.key, attempt.seq_len, 1)
            (scheduled,) = scheduler.schedule(BatchSpec(0, (step,))).requests
            out = self.model.run_request(scheduled, [attempt.next_token])
            self.decoded[attempt.rid] = (out.last_hidden, out.logits)
        request = _request_view(scheduler, attempt.key)
        locs = self.model.locs(request, 0, attempt.seq_len)
        kv = [self.model.pool.read(layer, locs) for layer in range(len(self.model.pool.layers))]
        rows = [(k.latent, k.index_k.view(torch.uint8), k.index_k_scale) for k in kv]
        return RequestReport(
            attempt.rid,
            True,
            history,
            len(scheduler.page_table(attempt.key)),
            tensor_bytes(rows),
            tensor_bytes(self.decoded[attempt.rid]),
        )


def _request_view(scheduler: Scheduler, rid: str) -> ScheduledRequest:
    """A scheduled-request view of what ``rid`` holds (its page table, for reads)."""
    return ScheduledRequest(rid, 0, scheduler.seq_len(rid), scheduler.page_table(rid), 0)


def serve_decode(
    cfg: ModelConfig,
    page_size: int,
    index_k_dtype: IndexKDtype,
    num_pages: int,
    timeout_s: float,
    authkey: bytes,
    started: Any,
    die_on_done_of: str | None = None,
    host: str = LOOPBACK,
) -> None:
    """Process entry point: builds the server on ``host``, reports its addresses on
    ``started``, serves."""
    torch.set_num_threads(1)
    server = DecodeServer(
        cfg, page_size, index_k_dtype, num_pages, timeout_s, authkey, die_on_done_of, host
    )
    started.put((server.address, server.transport.session))
    server.serve_forever()
