"""The PD prefill side: each CP rank streams the pages it owns of every request as they fill.

Per request: at its first chunk, ask the decode server for pages and a receive slab (every
rank asks; the answer is the same). After every batch, queue the owned pages that batch
completed; once enough bytes are queued, or a request's final chunk is written, pack every
queued piece into one of this rank's two staging buffers (registered once per process,
reused) and hand them to the writer thread, which writes them in one call while the rank
computes its next batch (``writer.PieceWriter``); once a request's final pieces landed, the
writer thread reports the request's pieces. Once the trace is done, drain the writes and
wait for every verdict.
The rank releases a request's pages only after the decode side acknowledged them (page
reuse waits for the ack); on a failure it keeps them, reports the error naming the request
and rank, and may retry: a retry sends the whole request again the same way.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from multiprocessing.connection import Client, Connection

import numpy as np

from cpkv_core.pd.attempt import SendAttempt
from cpkv_core.pd.pack import row_bytes, row_views
from cpkv_core.pd.protocol import Alloc, AllocReply, Await, Done, Fail, Piece, Verdict
from cpkv_core.pd.staging import process_staging, process_transport
from cpkv_core.pd.target import AFTER_TRACE, BAD_ADDRESS_OFFSET, PdFaults, PdTarget, SendResult
from cpkv_core.pd.wire import Message, call
from cpkv_core.pd.writer import Outgoing, PieceWriter, WriteStats
from cpkv_core.planning import KvLayout, ScheduledBatch, ScheduledRequest
from cpkv_core.planning.pd_pack import (
    completed_pages,
    rank_pieces,
    sender_first_rows,
    token_rows,
)
from cpkv_core.planning.tokens import token_ids
from cpkv_core.runtime.engine import CPEngine


class PdSender:
    """One rank's PD sender for one run of a trace.

    Every rank of the prefill group builds one with the same requests and calls
    ``after_batch`` after every batch and ``finish`` after the trace. Never raises for a
    transfer failure or an unreachable decode server: those become the requests' errors.

    The writer thread runs the writes and what follows them (``skip``, ``written``,
    ``settled``: record landed pieces, send ``Fail``, send ``Done``), in submission order.
    It alone marks an attempt failed, and it skips an attempt's pieces once it is failed, so
    no write of this rank lands in a slab after this rank sent ``Fail`` for it. The control
    connection is shared by both threads: every round trip holds ``_control``.
    """

    def __init__(
        self, engine: CPEngine, target: PdTarget, final_seq_lens: Mapping[str, int]
    ) -> None:
        """Args:
        final_seq_lens: every request to send, in order, with its tokens once prefilled
            (the scheduler knows a prompt's length; its last chunk completes its last page).
        """
        self.engine = engine
        self.target = target
        self.final_seq_lens = dict(final_seq_lens)
        self.rank = engine.comm.rank
        self.views = row_views(engine.pool)
        self.token_bytes = sum(row_bytes(self.views))
        self._began = time.perf_counter()
        self.writer = PieceWriter(
            process_transport(target.local_host),
            self.views,
            process_staging(target.staging_bytes, target.local_host),
            target.staging_bytes,
            target.min_write_bytes,
            self,
            target.overlap,
        )
        self.attempts: dict[str, SendAttempt] = {}
        self.errors: dict[str, list[str]] = {rid: [] for rid in final_seq_lens}
        self._batch = AFTER_TRACE
        self.broken: str | None = None
        """Why the decode server became unreachable, once it did (set by either thread)."""
        self._control = threading.Lock()
        """Held for every control round trip, and for setting ``broken``."""
        self.conn: Connection | None = None
        try:
            self.conn = Client(target.address, authkey=target.authkey)
        except OSError as exc:
            self._break(exc)

    @property
    def total_bytes(self) -> int:
        """KV bytes of every request (all ranks' pieces together)."""
        return sum(self.final_seq_lens.values()) * self.token_bytes

    def after_batch(self, batch: ScheduledBatch) -> None:
        """Queues the owned pages each request of ``batch`` completed and hands the queue to
        the writer when a request had its final chunk or enough bytes wait (the writer
        reports the finished requests once their pieces landed). Call it once the batch's
        KV is written: it packs before it returns, so the next batch may change the pool."""
        self._batch = batch.batch
        if self.broken is not None:
            return
        finals = []
        try:
            for req in batch.requests:
                if req.rid not in self.final_seq_lens:
                    continue
                state = self.attempts.get(req.rid) or self._start(req, 0)
                final = req.seq_len == self.final_seq_lens[req.rid]
                self._queue(req, state, completed_pages(req.seq_len, self._page_size, final))
                if final:
                    finals.append(req.rid)
            if finals or self.writer.due:
                self.writer.flush(self._batch, tuple(finals))
        except (EOFError, OSError) as exc:
            self._break(exc)

    @property
    def stats(self) -> WriteStats:
        """What this rank's writes cost so far."""
        return self.writer.stats

    @property
    def _page_size(self) -> int:
        return self.engine.deploy.page_size

    def _remote(self, rid: str) -> str:
        return self.target.rid_prefix + rid

    def _faults(self, attempt: int) -> PdFaults:
        return self.target.faults if attempt == 0 else PdFaults()

    def _start(self, req: ScheduledRequest, number: int) -> SendAttempt:
        """Asks the decode side for pages and a slab for one attempt."""
        final = self.final_seq_lens[req.rid]
        next_token = token_ids(req.rid_key, final, self.engine.cfg.vocab_size)
        alloc = Alloc(self._remote(req.rid), number, final, next_token, self.engine.deploy.cp_size)
        reply = self._call(alloc)
        state = SendAttempt(number, reply if isinstance(reply, AllocReply) else None)
        if state.reply is None:
            self._error(req.rid, number, f"decode refused pages: {reply}")
        elif state.reply.row_bytes != row_bytes(self.views):
            raise RuntimeError(
                f"decode pool rows {state.reply.row_bytes} differ from this rank's "
                f"{row_bytes(self.views)}: prefill and decode must share model and dtypes"
            )
        self.attempts[req.rid] = state
        return state

    def _call(self, message: Message) -> Message | None:
        """One control round trip, from either thread."""
        with self._control:
            if self.conn is None:
                raise OSError(f"no connection to the decode server: {self.broken}")
            return call(self.conn, message)

    def _break(self, exc: BaseException) -> None:
        """The decode server is unreachable: the first thread to see it says why."""
        with self._control:
            if self.broken is None:
                self.broken = repr(exc)

    def _error(self, rid: str, attempt: int, reason: str) -> None:
        self.errors[rid].append(f"request {rid} rank {self.rank} attempt {attempt}: {reason}")

    def _queue(self, req: ScheduledRequest, state: SendAttempt, stop: int) -> None:
        """Queues this rank's pieces of the positions in ``[state.sent_upto, stop)``."""
        if stop <= state.sent_upto:
            return
        ps, cp_size = self._page_size, self.engine.deploy.cp_size
        seq_len = self.final_seq_lens[req.rid]
        table = np.asarray(req.page_table, dtype=np.int64)
        pieces, cursor = rank_pieces(
            table,
            state.sent_upto,
            stop,
            seq_len,
            ps,
            cp_size,
            self.rank,
            self.token_bytes,
            state.cursor,
            self.target.staging_bytes,
        )
        state.cursor, state.sent_upto = cursor, stop
        if state.reply is None or state.failed:
            return
        sharded = self.engine.kv_layout is KvLayout.SHARDED
        first_rows = sender_first_rows(table, ps, cp_size, sharded)
        bad = self._faults(state.number).fail == (req.rid, self.rank)
        for offset, positions in pieces:
            dst = state.reply.slab + offset + (BAD_ADDRESS_OFFSET if bad else 0)
            rows = token_rows(first_rows, positions, seq_len, ps)
            piece = Piece(offset, tuple(positions.tolist()))
            self.writer.add(Outgoing(req.rid, rows, dst, state.reply.session, piece))

    def skip(self, out: Outgoing) -> bool:
        """Writer thread: the piece's attempt failed, or the decode server is gone."""
        return self.broken is not None or self.attempts[out.rid].failed

    def written(self, landed: list[Outgoing], failed: dict[str, str], batch: int) -> None:
        """Writer thread, after each write: records what landed; a request whose write
        failed sends ``Fail`` (once), and nothing more of that attempt is written."""
        for out in landed:
            state = self.attempts[out.rid]
            state.pieces.append(out.piece)
            state.bytes_sent += len(out.rows) * self.token_bytes
            state.write_batches.append(batch)
        for rid, reason in failed.items():
            state = self.attempts[rid]
            if not state.failed:
                state.failed = True
                self._settle(Fail(self._remote(rid), state.number, self.rank, reason))

    def settled(self, rids: tuple[str, ...]) -> None:
        """Writer thread, once every piece of ``rids`` landed: reports each (``Done``)."""
        for rid in rids:
            self._report(rid, self.attempts[rid])

    def _settle(self, message: Message) -> None:
        if self.broken is not None:
            return
        try:
            self._call(message)
        except (EOFError, OSError) as exc:
            self._break(exc)

    def _report(self, rid: str, state: SendAttempt) -> None:
        """Reports every piece of the attempt (unless refused, failed or stalled)."""
        if state.reply is None or state.failed:
            return
        if self._faults(state.number).stall == (rid, self.rank):
            return
        done = Done(
            self._remote(rid), state.number, self.rank, tuple(state.pieces), state.bytes_sent
        )
        self._settle(done)

    def finish(self) -> list[SendResult]:
        """Awaits every request's verdict, retries failed ones, releases acknowledged pages."""
        ready: set[str] = set()
        todo = [rid for rid in self.final_seq_lens if rid in self.attempts]
        try:
            if self.writer.pending and self.broken is None:
                self.writer.flush(
                    self._batch
                )  # NOTE: empty after a whole trace; kept for partial runs
            # NOTE: every Done/Fail of this rank goes out before its Await, which tells the
            # decode side this rank writes nothing more into the attempt.
            self.writer.drain()
            for number in range(self.target.retries + 1):
                if self.broken is not None:
                    break
                if number > 0:
                    for rid in todo:
                        self._resend(rid, number)
                    self.writer.drain()
                for rid in todo:
                    verdict = self._call(Await(self._remote(rid), number, self.rank))
                    assert isinstance(verdict, Verdict), verdict
                    if verdict.ready:
                        self.engine.forget(rid)  # page reuse waits for the ack
                        ready.add(rid)
                    else:
                        self._error(rid, number, verdict.reason)
                todo = [rid for rid in todo if rid not in ready]
        except (EOFError, OSError) as exc:
            self._break(exc)
        finally:
            self.writer.close()
            if self.conn is not None:
                self.conn.close()
            self.stats.loop_seconds = time.perf_counter() - self._began
        return [self._result(rid, rid in ready) for rid in self.final_seq_lens]

    def _resend(self, rid: str, number: int) -> None:
        """A new attempt of ``rid``: the whole request at once."""
        req = self.engine.requests[rid]
        self._batch = AFTER_TRACE
        state = self._start(req, number)
        self._queue(req, state, completed_pages(req.seq_len, self._page_size, final=True))
        self.writer.flush(self._batch, (rid,))

    def _result(self, rid: str, ready: bool) -> SendResult:
        errors = list(self.errors[rid])
        if self.broken is not None and not ready:
            errors.append(
                f"request {rid} rank {self.rank}: decode server unreachable: {self.broken}"
            )
        state = self.attempts.get(rid)
        return SendResult(
            rid=rid,
            rank=self.rank,
            ready=ready,
            attempts=state.number + 1 if state else 0,
            bytes_sent=state.bytes_sent if state else 0,
            released=ready,
            errors=tuple(errors),
            write_batches=tuple(state.write_batches) if state else (),
        )
