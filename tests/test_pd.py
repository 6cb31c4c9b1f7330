"""PD over Mooncake: prefill ranks and a decode server in separate processes, the real
transfer engine over TCP loopback; rebuilt KV and decode step against the reference."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import numpy as np
import pytest
import torch

from cpkv.run.jobs import final_seq_lens
from cpkv.run.pd import PdJob, run_pd
from cpkv_core.config import CpMode, model_preset
from cpkv_core.dist import LocalGroup
from cpkv_core.pd.decode import DecodeServer
from cpkv_core.pd.decode_group import DecodeSpec
from cpkv_core.pd.protocol import Alloc, AllocReply, Await, Done, Fail, Piece
from cpkv_core.pd.receive import tiling_error
from cpkv_core.pd.target import MIN_WRITE_BYTES, STAGING_BYTES, PdFaults
from cpkv_core.pd.transport import TransferError, Write
from cpkv_core.pd.writer import PieceWriter
from cpkv_core.pd.writes import Outgoing
from cpkv_core.planning import SplitStrategy
from cpkv_core.planning.pd_pack import page_runs
from cpkv_core.planning.pd_reshard import pair_tokens
from cpkv_core.runtime.kv_pool import kv_bytes_per_page
from cpkv_core.traces.trace import load_trace
from phases.ids import PhaseId
from tests.conftest import DATA, make_deploy

TINY = model_preset("tiny")
ALL = frozenset(PhaseId)
TOKEN_BYTES = 456
"""The tiny model's bytes a token (2 layers x 228 B)."""


def pd_job(
    trace: str,
    cp_size: int,
    levels: tuple[int, ...],
    page_size: int = 4,
    staging_bytes: int = STAGING_BYTES,
    min_write_bytes: int = MIN_WRITE_BYTES,
    overlap: bool = True,
    cp_mode: CpMode = CpMode.IN_SEQ_SPLIT,
    decode_cp_size: int = 1,
) -> PdJob:
    deploy = make_deploy(cp_size, page_size, cp_mode).model_copy(
        update={"decode_cp_size": decode_cp_size}
    )
    batches = load_trace(DATA / f"{trace}.jsonl", page_size).batches
    return PdJob(
        deploy,
        batches,
        levels,
        ALL,
        staging_bytes=staging_bytes,
        min_write_bytes=min_write_bytes,
        overlap=overlap,
    )


def test_overlapping_pieces_do_not_tile_the_slab() -> None:
    pieces = [Piece(0, (0, 1)), Piece(4, (2,))]  # page 4, 1 byte a token: [0, 8) and [4, 8)
    assert "overlap" in tiling_error(pieces, 12, 12, 4, 1)
    assert tiling_error([Piece(0, (0, 1)), Piece(8, (2,))], 12, 12, 4, 1) == ""


def test_a_piece_that_reaches_past_the_slab_does_not_tile_it() -> None:
    """Positions 0 and 1-2 without overlap, but the second piece starts 4 bytes late and
    so ends past the 12-byte slab (page 4, 1 byte a token)."""
    assert "leave the slab" in tiling_error([Piece(0, (0,)), Piece(8, (1, 2))], 12, 12, 4, 1)
    assert tiling_error([Piece(0, (0,)), Piece(4, (1, 2))], 12, 12, 4, 1) == ""


@pytest.mark.gloo
@pytest.mark.usefixtures("forked")
def test_decode_rebuilds_every_level_byte_for_byte() -> None:
    """Levels 0, 2, 3 (mixed trace) and 4, 5 (long requests) at cp_size 1, 2 and 4, and
    level 5 under round-robin (the page interleave) at cp_size 2: one 4-rank prefill
    spawn, one decode process (re-sharded runs: ``tests/test_cli.py``, the fault tests
    below, and in process ``test_pd_grid.py``). cp 1 writes
    after every batch (on the mixed trace synchronously, overlap off: the rank's wait is
    all its send time); cp 2 too, with a staging buffer of one page (every page a piece of
    its own); cp 4 queues up to the default bytes, and writes them when some request's
    final chunk is done. Every other job writes on its ranks' writer threads."""
    page_bytes = kv_bytes_per_page(TINY, make_deploy().index_k_dtype, 4)
    writes = {1: (STAGING_BYTES, 0), 2: (page_bytes, 0), 4: (STAGING_BYTES, MIN_WRITE_BYTES)}
    jobs = []
    for cp_size, (staging, min_write) in writes.items():
        jobs += [
            pd_job("mixed", cp_size, (0, 2, 3), 4, staging, min_write, overlap=cp_size != 1),
            pd_job("long", cp_size, (4, 5), 4, staging, min_write),
        ]
    # NOTE: round-robin's level 5 (page interleave, direct writes) on the same spawn.
    jobs.append(pd_job("long", 2, (5,), 4, cp_mode=CpMode.ROUND_ROBIN_SPLIT))
    reports, runs = run_pd(TINY, jobs)
    interleaved = runs[-1][0].steps
    assert {s.decision.plan.split for s in interleaved if s.decision.phase == 5} == {
        SplitStrategy.PAGE_INTERLEAVED
    }
    for job, job_runs in zip(jobs, runs, strict=True):
        for run in job_runs:
            for stats in run.pd_stats:
                assert stats.bytes > 0 and stats.calls > 0
                if not job.overlap:
                    assert stats.exposed_seconds == stats.seconds
    for job, report in zip(jobs, reports, strict=True):
        assert report.ok, [r for r in report.requests if not r.ok]
        for result in report.requests:
            assert result.kv_equal and result.decode_max_abs_diff == 0.0
            assert all(result.released_by_rank)
            assert len(result.bytes_by_rank) == job.deploy.cp_size
    # Sends stream: mixed's "a" (58 tokens: 37 in batch 0, 21 in batch 1, of 4 batches)
    # is written after each of its chunks, not after the trace.
    pages_of_a, full_after_batch0 = -(-58 // 4), 37 // 4
    for cp_size, job_runs in ((1, runs[0]), (2, runs[2]), (4, runs[4])):
        for run in job_runs:
            a_batches = [b for rank_results in run.pd for b in rank_results[0].write_batches]
            if cp_size == 1:  # one piece per batch
                assert a_batches == [0, 1]
            elif cp_size == 2:  # one piece per page, as the pages fill
                assert sorted(a_batches) == [0] * full_after_batch0 + [1] * (
                    pages_of_a - full_after_batch0
                )
            else:  # queued, then written with b's final chunk and its own: one piece each
                for rank_results in run.pd:
                    assert rank_results[0].write_batches in ((0, 1), (0,), (1,))
                assert sorted(set(a_batches)) == [0, 1]
    # cp_size 4: each rank sends about a quarter, the pages it owns. Dealt pages (levels
    # 0-4) balance within one page per request; compute-owner pages (level 5) within two
    # pages per chunk, since page-aligned blocks differ by one page.
    for job, report in zip(jobs[4:6], reports[4:6], strict=True):
        for result in report.requests:
            chunks = sum(r.rid == result.rid for b in job.batches for r in b.requests)
            slack = 2 * chunks if result.level == 5 else 1
            total = sum(result.bytes_by_rank)
            assert max(result.bytes_by_rank) <= total / 4 + slack * page_bytes, result


@pytest.mark.gloo
@pytest.mark.usefixtures("forked")
def test_failed_and_timed_out_transfers_leave_no_request_ready() -> None:
    faults = PdFaults(fail=("a", 1), stall=("b", 0))
    # NOTE: after a rejected write Mooncake's TCP transport re-establishes the session, and
    # the rank's next write took ~4 s here; the timeout leaves ample room for that.
    job = pd_job("pd_small", 2, (2,), decode_cp_size=2)
    (report,), _ = run_pd(TINY, [job], timeout_s=12.0, faults=faults)
    by_rid = {r.rid: r for r in report.requests}
    failed, stalled, fine = by_rid["a"], by_rid["b"], by_rid["c"]
    for result in (failed, stalled):
        assert not result.ready and not result.ok
        assert result.decode_pages == 0  # the attempt's pages went back; nothing else changed
        assert not any(result.released_by_rank)  # prefill keeps its pages without an ack
    assert any("request a rank 1" in e and "failed" in e for e in failed.errors)
    assert any("timed out" in e and "[0]" in e for e in stalled.errors)
    assert fine.ok and fine.kv_equal


@pytest.mark.gloo
@pytest.mark.usefixtures("forked")
def test_a_failed_transfer_can_be_retried() -> None:
    job = pd_job("pd_small", 2, (5,), decode_cp_size=2)
    (report,), (runs,) = run_pd(TINY, [job], faults=PdFaults(fail=("a", 0)), retries=1)
    assert report.ok
    retried = next(r for r in report.requests if r.rid == "a")
    assert retried.kv_equal and any("attempt 0" in e for e in retried.errors)
    # each prefill rank wrote each decode rank the tokens of the positions both own, the
    # retry (every position at once) included
    tables = {r.rid: r.page_table for step in runs[0].steps for r in step.scheduled.requests}
    lens = final_seq_lens(job.batches)
    for result in report.requests:
        table = np.asarray(tables[result.rid])
        pairs = pair_tokens(table, 0, len(table), lens[result.rid], 4, 2, 2)
        assert [list(row) for row in result.bytes_by_pair] == (pairs * TOKEN_BYTES).tolist()


@pytest.mark.gloo
@pytest.mark.usefixtures("forked")
def test_decode_server_killed_mid_transfer_marks_nothing_ready() -> None:
    job = pd_job("pd_small", 2, (2,), decode_cp_size=2)
    (report,), _ = run_pd(TINY, [job], die_on_done_of="j0/0/b")
    assert not report.ok
    assert report.errors and "decode server unreachable" in report.errors[0]
    for result in report.requests:  # every request was in flight: none was acknowledged
        assert not result.ready
        assert not any(result.released_by_rank)  # prefill keeps the pages for a retry
        assert any("unreachable" in e for e in result.errors)


def test_failed_attempt_pages_stay_quarantined_until_every_sender_settled() -> None:
    """In-process decode server, handlers called directly: a late write from a failed
    attempt can never land in pages a retry or another request holds."""
    server = DecodeServer(DecodeSpec(TINY, 4, make_deploy().index_k_dtype, 64, 5.0), b"k")
    try:
        first = server._on_alloc(Alloc("r", 0, 10, 3, senders=2))
        assert isinstance(first, AllocReply)
        free_before = server.scheduler.allocator.num_free_pages
        server._on_fail(Fail("r", 0, 0, "write rejected"))
        assert server.scheduler.allocator.num_free_pages == free_before  # rank 1 may still write
        retry = server._on_alloc(Alloc("r", 1, 10, 3, senders=2))
        assert isinstance(retry, AllocReply)
        assert set(retry.page_table).isdisjoint(first.page_table)
        slab_bytes = 10 * server.token_bytes  # the receive slabs are kept apart the same way
        assert abs(retry.slab - first.slab) >= slab_bytes
        assert server.arena.slab("r#0")[1] == slab_bytes
        verdict = server._on_await(Await("r", 0, 1))  # rank 1 is done with attempt 0
        assert not verdict.ready
        with pytest.raises(KeyError):
            server.arena.slab("r#0")  # freed with the pages, once every sender settled
        assert server.scheduler.allocator.num_free_pages == free_before - len(
            retry.page_table
        ) + len(first.page_table)
    finally:
        server.close()


def test_a_completed_attempt_is_dropped_when_another_decode_rank_failed_it() -> None:
    """Decode rank 1 of 2, handlers called directly: every prefill rank's pieces landed
    and the attempt completed, then a prefill rank reports that decode rank 0 failed it
    (its ``Fail`` after the verdicts): the attempt fails and its pages go back."""
    (_, comm) = LocalGroup(2).communicators()
    spec = DecodeSpec(TINY, 4, make_deploy().index_k_dtype, 64, 5.0, dcp_size=2)
    server = DecodeServer(spec, b"k", comm)
    try:
        free = server.scheduler.allocator.num_free_pages
        reply = server._on_alloc(Alloc("r", 0, 14, 3, senders=2))  # positions 0-3: 1, 3 here
        assert isinstance(reply, AllocReply) and len(reply.page_table) == 2
        tokens = server.token_bytes
        server._on_done(Done("r", 0, 0, (Piece(0, (1,)),), 4 * tokens))
        server._on_done(Done("r", 0, 1, (Piece(4 * tokens, (3,)),), 2 * tokens))
        assert server._on_await(Await("r", 0, 0)).ready
        server._on_fail(Fail("r", 0, 1, "decode rank 0 failed the attempt: timed out"))
        verdict = server._on_await(Await("r", 0, 0))
        assert not verdict.ready and "decode rank 0 failed" in verdict.reason
        assert server.scheduler.allocator.num_free_pages == free
    finally:
        server.close()


def test_the_deadline_runs_from_the_first_report_not_from_the_first_chunk() -> None:
    """Streaming senders allocate at a request's first chunk; a prefill longer than the
    timeout must not fail an attempt whose last sender reports just after another awaits."""
    server = DecodeServer(DecodeSpec(TINY, 4, make_deploy().index_k_dtype, 64, 0.3), b"k")
    try:
        assert isinstance(server._on_alloc(Alloc("r", 0, 10, 3, senders=2)), AllocReply)
        time.sleep(0.4)  # later chunks prefill for longer than the timeout
        tokens = server.token_bytes
        server._on_done(Done("r", 0, 0, (Piece(0, (0, 2)),), 6 * tokens))
        late = Done("r", 0, 1, (Piece(6 * tokens, (1,)),), 4 * tokens)
        threading.Timer(0.05, server._on_done, (late,)).start()
        assert server._on_await(Await("r", 0, 0)).ready
    finally:
        server.close()


class _FakeTransport:
    """Records every write; holds a write until its destination's gate opens; rejects any
    write to a bad destination (as the engine does an unregistered address)."""

    def __init__(self, bad: frozenset[int] = frozenset()) -> None:
        self.bad = bad
        self.gates: dict[int, threading.Event] = {}
        self.written: list[int] = []
        self.events: list[str] = []
        self.entered = threading.Event()
        """Set once a write started."""

    def write(self, session: str, writes: Sequence[Write]) -> None:
        self.entered.set()
        for w in writes:
            if w.dst in self.gates:
                assert self.gates[w.dst].wait(10), f"gate of {w.dst} never opened"
        if any(w.dst in self.bad for w in writes):
            raise TransferError(f"write to {session} failed")
        self.written += [w.dst for w in writes]
        self.events += [f"wrote {w.dst}" for w in writes]


class _FakeSink:
    """``PdSender``'s side of the contract: marks a request failed when its write failed,
    skips a failed request's pieces, records what it heard, in order."""

    def __init__(self, events: list[str]) -> None:
        self.events = events
        self.failed: set[str] = set()

    def skip(self, out: Outgoing) -> bool:
        return out.rid in self.failed

    def written(self, landed: list[Outgoing], failed: dict[str, str], batch: int) -> None:
        self.events += [f"landed {o.dst}" for o in landed]
        for rid in failed:
            self.failed.add(rid)
            self.events.append(f"fail {rid}")

    def settled(self, rids: tuple[str, ...]) -> None:
        self.events += [f"done {rid}" for rid in rids if rid not in self.failed]


def _writer(transport: _FakeTransport, overlap: bool = True) -> tuple[PieceWriter, _FakeSink]:
    views = [torch.arange(64, dtype=torch.uint8).view(16, 4), torch.ones(16, 2, dtype=torch.uint8)]
    staging = [torch.zeros(48, dtype=torch.uint8) for _ in range(2)]  # 8 tokens of 6 bytes
    sink = _FakeSink(transport.events)
    return PieceWriter(transport, views, staging, 48, 0, sink, overlap), sink


def _piece(rid: str, dst: int, rows: list[int]) -> Outgoing:
    runs = page_runs(np.asarray(rows, dtype=np.int64), 4)
    return Outgoing(rid, runs, dst, "peer:1", Piece(dst, (0,)))


def test_a_flush_returns_before_its_write_lands_and_done_follows_the_write() -> None:
    """Overlap: the rank's thread packs and goes on while the write is in flight; the
    request is reported only once its bytes landed; the rank waited only for packing."""
    transport = _FakeTransport()
    transport.gates[100] = threading.Event()
    writer, _ = _writer(transport)
    writer.add(_piece("a", 100, [0, 1, 2]))
    writer.flush(0, finals=("a",))
    assert transport.entered.wait(10) and transport.events == []  # the write is held
    time.sleep(0.2)
    transport.gates[100].set()
    writer.close()
    assert transport.events == ["wrote 100", "landed 100", "done a"]
    assert writer.stats.seconds >= 0.2 > writer.stats.exposed_seconds
    assert writer.stats.bytes == 3 * 6 and writer.stats.calls == 1


def test_packing_waits_only_while_both_staging_buffers_are_in_flight() -> None:
    transport = _FakeTransport()
    for dst in (100, 200, 300):
        transport.gates[dst] = threading.Event()
    writer, _ = _writer(transport)
    for dst in (100, 200):
        writer.add(_piece("a", dst, [0]))
        writer.flush(dst)  # two buffers: neither flush waits
    writer.add(_piece("a", 300, [1]))
    third = threading.Thread(target=writer.flush, args=(300,))
    third.start()
    third.join(0.2)
    assert third.is_alive()  # packing the third write would overwrite an in-flight buffer
    transport.gates[100].set()
    third.join(10)
    assert not third.is_alive()
    transport.gates[200].set()
    transport.gates[300].set()
    writer.close()
    assert transport.written == [100, 200, 300]


@pytest.mark.parametrize("overlap", [True, False])
def test_no_piece_of_a_request_is_written_after_its_write_failed(overlap: bool) -> None:
    """The first write of "a" is rejected while a's next piece is already packed behind it:
    that piece is never written, "b" in the same write is, and "a" is never reported done."""
    transport = _FakeTransport(bad=frozenset({100}))
    transport.gates[100] = threading.Event()
    if not overlap:  # NOTE: writes on this thread: nothing may hold them
        transport.gates[100].set()
    writer, sink = _writer(transport, overlap)
    writer.add(_piece("a", 100, [0, 1]))
    writer.flush(0)
    writer.add(_piece("a", 200, [2, 3]))
    writer.add(_piece("b", 300, [4]))
    writer.flush(1, finals=("a", "b"))
    transport.gates[100].set()
    writer.close()
    assert sink.failed == {"a"}
    assert transport.written == [300]
    assert transport.events == ["fail a", "wrote 300", "landed 300", "done b"]


def test_an_unexpected_error_on_the_writer_thread_is_raised_on_the_rank_thread() -> None:
    transport = _FakeTransport()
    writer, sink = _writer(transport)

    def boom(rids: tuple[str, ...]) -> None:
        raise ValueError(f"sink broke on {rids}")

    sink.settled = boom  # type: ignore[method-assign]
    writer.add(_piece("a", 100, [0]))
    writer.flush(0, finals=("a",))
    with pytest.raises(ValueError, match="sink broke on"):
        writer.drain()
    writer.close()
