"""The PD prefill side: each CP rank streams the pages it owns of every request, as they fill,
to the decode rank that owns each of them.

First the rank exchanges layouts with every decode rank (``links.handshake``); a mismatch
refuses every transfer at once, naming both layouts. Per request: at its first chunk, ask
every decode rank for its pages and a receive slab (every prefill rank asks; the answer is
the same). After every batch, queue the owned pages it completed, each for the decode rank
that owns its position (``planning.pd_reshard``); once enough bytes wait, or a request's
final chunk is written, pack the queue destination by destination into one of two staging
buffers (registered once per process) and hand it to the writer thread, which writes while
the rank computes its next batch (``writer.PieceWriter``) and reports a request's pieces to
every decode rank once its last ones landed. After the trace, drain the writes and await
every decode rank's verdict: a request is ready only when every decode rank completed it
(the ones that did are told to drop it otherwise). The rank releases a request's pages only
after that ack; on a failure it keeps them, names the request and rank, and may retry the
whole request as a new attempt.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import numpy as np

from cpkv_core.pd.attempt import SendAttempt
from cpkv_core.pd.layout import pool_layout
from cpkv_core.pd.links import DecodeLinks, handshake
from cpkv_core.pd.pack import row_bytes, row_views
from cpkv_core.pd.protocol import Alloc, AllocReply, Await, Done, Fail, Piece, Verdict
from cpkv_core.pd.staging import process_staging, process_transport
from cpkv_core.pd.target import AFTER_TRACE, BAD_ADDRESS_OFFSET, PdFaults, PdTarget, SendResult
from cpkv_core.pd.wire import Message
from cpkv_core.pd.writer import PieceWriter
from cpkv_core.pd.writes import Outgoing, WriteStats
from cpkv_core.planning import KvLayout, ScheduledBatch, ScheduledRequest
from cpkv_core.planning.pd_pack import completed_pages, page_runs, sender_first_rows, token_rows
from cpkv_core.planning.pd_reshard import reshard_pieces
from cpkv_core.planning.tokens import token_ids
from cpkv_core.runtime.engine import CPEngine


class PdSender:
    """One rank's PD sender for one run of a trace.

    Every rank of the prefill group builds one with the same requests and calls
    ``after_batch`` after every batch and ``finish`` after the trace. Never raises for a
    transfer failure, a refused handshake or an unreachable decode group: those become the
    requests' errors.

    The writer thread runs the writes and what follows them (``skip``, ``written``,
    ``settled``: record landed pieces, send ``Fail``, send ``Done``), in submission order.
    It alone marks an attempt failed, and it skips an attempt's pieces once it is failed, so
    no write of this rank lands in a slab after this rank sent ``Fail`` for it. The control
    connections are shared by both threads: every round trip holds ``links``' lock.
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
        self.dests = engine.deploy.decode_cp_size
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
        self.links = DecodeLinks(target.addresses, target.authkey)
        layout = pool_layout(engine.pool, engine.deploy.cp_size, self.dests)
        self.refused = ""
        """Why the handshake refused the transfer (both layouts named), or ""."""
        try:
            if self.links.broken is None:
                self.refused = handshake(self.links, self.rank, layout)
        except (EOFError, OSError) as exc:
            self.links.break_(exc)

    @property
    def total_bytes(self) -> int:
        """KV bytes of every request (all ranks' pieces together)."""
        return sum(self.final_seq_lens.values()) * self.token_bytes

    @property
    def _stopped(self) -> bool:
        """Nothing more goes out: the decode group is unreachable or refused the layout."""
        return self.links.broken is not None or bool(self.refused)

    def after_batch(self, batch: ScheduledBatch) -> None:
        """Queues the owned pages each request of ``batch`` completed and hands the queue to
        the writer when a request had its final chunk or enough bytes wait (the writer
        reports the finished requests once their pieces landed). Call it once the batch's
        KV is written: it packs before it returns, so the next batch may change the pool."""
        self._batch = batch.batch
        if self._stopped:
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
            self.links.break_(exc)

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
        """Asks every decode rank for pages and a slab for one attempt; when one refuses,
        the others are told the attempt failed (so none waits for this rank)."""
        final = self.final_seq_lens[req.rid]
        next_token = token_ids(req.rid_key, final, self.engine.cfg.vocab_size)
        alloc = Alloc(self._remote(req.rid), number, final, next_token, self.engine.deploy.cp_size)
        replies = [self.links.call(dest, alloc) for dest in range(self.dests)]
        granted = tuple(r for r in replies if isinstance(r, AllocReply))
        whole = granted if len(granted) == self.dests else None
        state = SendAttempt.start(number, whole, self.dests)
        if state.replies is None:
            refusal = next(r for r in replies if not isinstance(r, AllocReply))
            self._error(req.rid, number, f"decode refused pages: {refusal}")
            for dest, reply in enumerate(replies):
                if isinstance(reply, AllocReply):
                    self._settle(dest, Fail(alloc.rid, number, self.rank, "a decode rank refused"))
        self.attempts[req.rid] = state
        return state

    def _error(self, rid: str, attempt: int, reason: str) -> None:
        self.errors[rid].append(f"request {rid} rank {self.rank} attempt {attempt}: {reason}")

    def _queue(self, req: ScheduledRequest, state: SendAttempt, stop: int) -> None:
        """Queues this rank's pieces of the positions in ``[state.sent_upto, stop)``."""
        if stop <= state.sent_upto:
            return
        ps, cp_size = self._page_size, self.engine.deploy.cp_size
        seq_len = self.final_seq_lens[req.rid]
        table = np.asarray(req.page_table, dtype=np.int64)
        pieces, cursors = reshard_pieces(
            table,
            state.sent_upto,
            stop,
            seq_len,
            ps,
            cp_size,
            self.rank,
            self.dests,
            self.token_bytes,
            state.cursors,
            self.target.staging_bytes,
        )
        state.cursors, state.sent_upto = cursors, stop
        if state.replies is None or state.failed:
            return
        sharded = self.engine.kv_layout is KvLayout.SHARDED
        first_rows = sender_first_rows(table, ps, cp_size, sharded)
        bad = self._faults(state.number).fail == (req.rid, self.rank)
        for piece in pieces:
            reply = state.replies[piece.dest]
            dst = reply.slab + piece.offset + (BAD_ADDRESS_OFFSET if bad else 0)
            rows = page_runs(token_rows(first_rows, piece.positions, seq_len, ps), ps)
            sent = Piece(piece.offset, tuple(piece.positions.tolist()))
            self.writer.add(Outgoing(req.rid, rows, dst, reply.session, sent, piece.dest))

    def skip(self, out: Outgoing) -> bool:
        """Writer thread: the piece's attempt failed, or nothing more goes out."""
        return self._stopped or self.attempts[out.rid].failed

    def written(self, landed: list[Outgoing], failed: dict[str, str], batch: int) -> None:
        """Writer thread, after each write: records what landed; a request whose write
        failed sends ``Fail`` to every decode rank (once), and nothing more of that attempt
        is written."""
        for out in landed:
            state = self.attempts[out.rid]
            state.pieces[out.dest].append(out.piece)
            state.bytes_by_dest[out.dest] += len(out.rows) * self.token_bytes
            state.write_batches.append(batch)
        for rid, reason in failed.items():
            state = self.attempts[rid]
            if not state.failed:
                state.failed = True
                for dest in range(self.dests):
                    self._settle(dest, Fail(self._remote(rid), state.number, self.rank, reason))

    def settled(self, rids: tuple[str, ...]) -> None:
        """Writer thread, once every piece of ``rids`` landed: reports each (``Done``)."""
        for rid in rids:
            self._report(rid, self.attempts[rid])

    def _settle(self, dest: int, message: Message) -> None:
        if self.links.broken is not None:
            return
        try:
            self.links.call(dest, message)
        except (EOFError, OSError) as exc:
            self.links.break_(exc)

    def _report(self, rid: str, state: SendAttempt) -> None:
        """Reports every decode rank its pieces of the attempt (unless refused, failed or
        stalled)."""
        if state.replies is None or state.failed:
            return
        if self._faults(state.number).stall == (rid, self.rank):
            return
        for dest in range(self.dests):
            pieces, nbytes = tuple(state.pieces[dest]), state.bytes_by_dest[dest]
            self._settle(dest, Done(self._remote(rid), state.number, self.rank, pieces, nbytes))

    def finish(self) -> list[SendResult]:
        """Awaits every request's verdicts, retries failed ones, releases acknowledged pages."""
        ready: set[str] = set()
        todo = [rid for rid in self.final_seq_lens if rid in self.attempts]
        try:
            if self.writer.pending and not self._stopped:
                self.writer.flush(self._batch)  # NOTE: empty after a whole trace
            # NOTE: every Done/Fail of this rank goes out before its Await, which tells the
            # decode side this rank writes nothing more into the attempt.
            self.writer.drain()
            for number in range(self.target.retries + 1):
                if self._stopped:
                    break
                if number > 0:
                    for rid in todo:
                        self._resend(rid, number)
                    self.writer.drain()
                for rid in todo:
                    if self._await_all(rid, number):
                        self.engine.forget(rid)  # page reuse waits for the ack
                        ready.add(rid)
                todo = [rid for rid in todo if rid not in ready]
        except (EOFError, OSError) as exc:
            self.links.break_(exc)
        finally:
            self.writer.close()
            self.links.close()
            self.stats.loop_seconds = time.perf_counter() - self._began
        return [self._result(rid, rid in ready) for rid in self.final_seq_lens]

    def _await_all(self, rid: str, number: int) -> bool:
        """Every decode rank's verdict on an attempt: ready only if all completed it; the
        ones that did are told to drop it otherwise (another decode rank failed it)."""
        remote = self._remote(rid)
        verdicts = []
        for dest in range(self.dests):
            verdict = self.links.call(dest, Await(remote, number, self.rank))
            assert isinstance(verdict, Verdict), verdict
            verdicts.append(verdict)
        failed = [(d, v.reason) for d, v in enumerate(verdicts) if not v.ready]
        for dest, reason in failed:
            self._error(rid, number, reason if self.dests == 1 else f"decode rank {dest}: {reason}")
        if failed:
            why = f"decode rank {failed[0][0]} failed the attempt: {failed[0][1]}"
            for dest, verdict in enumerate(verdicts):
                if verdict.ready:
                    self._settle(dest, Fail(remote, number, self.rank, why))
        return not failed

    def _resend(self, rid: str, number: int) -> None:
        """A new attempt of ``rid``: the whole request at once."""
        req = self.engine.requests[rid]
        self._batch = AFTER_TRACE
        state = self._start(req, number)
        self._queue(req, state, completed_pages(req.seq_len, self._page_size, final=True))
        self.writer.flush(self._batch, (rid,))

    def _result(self, rid: str, ready: bool) -> SendResult:
        errors = list(self.errors[rid])
        if self.refused:
            errors.append(f"request {rid} rank {self.rank}: handshake refused: {self.refused}")
        elif self.links.broken is not None and not ready:
            errors.append(
                f"request {rid} rank {self.rank}: decode server unreachable: {self.links.broken}"
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
            bytes_by_dest=tuple(state.bytes_by_dest) if state else (),
        )
