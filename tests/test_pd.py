"""PD over Mooncake: prefill ranks and a decode server in separate processes, the real
transfer engine over TCP loopback; rebuilt KV and decode step against the reference."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv.pd import PdJob, run_pd
from cpkv_core.config import model_preset
from cpkv_core.pd.decode import DecodeServer
from cpkv_core.pd.pack import runs_for_rank
from cpkv_core.pd.prefill import PdFaults
from cpkv_core.pd.protocol import Alloc, AllocReply, Await, Fail
from cpkv_core.planning.ownership import owner_of_page
from cpkv_core.runtime.kv_pool import kv_bytes_per_page
from cpkv_core.traces.trace import load_trace
from phases.ids import PhaseId
from tests.conftest import DATA, make_deploy

TINY = model_preset("tiny")
ALL = frozenset(PhaseId)


def pd_job(trace: str, cp_size: int, levels: tuple[int, ...], page_size: int = 4) -> PdJob:
    deploy = make_deploy(cp_size, page_size)
    batches = load_trace(DATA / f"{trace}.jsonl", page_size).batches
    return PdJob(deploy, batches, levels, ALL)


@settings(max_examples=100, deadline=None)
@given(
    cp_size=st.integers(1, 4),
    page_size=st.sampled_from([1, 4, 16]),
    seq_len=st.integers(1, 200),
    sharded=st.booleans(),
    data=st.data(),
)
def test_ranks_send_each_page_once_in_merged_runs(
    cp_size: int, page_size: int, seq_len: int, sharded: bool, data: st.DataObject
) -> None:
    pages = -(-seq_len // page_size)
    table = data.draw(st.lists(st.integers(0, 500), min_size=pages, max_size=pages, unique=True))
    dst = data.draw(st.permutations(range(pages)))
    sent = []
    for rank in range(cp_size):
        for run in runs_for_rank(table, dst, seq_len, page_size, cp_size, rank, sharded):
            assert all(owner_of_page(table[j], cp_size) == rank for j in run.positions)
            assert run.dst_row == dst[run.positions[0]] * page_size
            tokens = sum(min(page_size, seq_len - j * page_size) for j in run.positions)
            assert run.tokens == tokens
            sent += run.positions
    assert sorted(sent) == list(range(pages))


def test_contiguous_pages_merge_into_one_run() -> None:
    runs = runs_for_rank([0, 1, 2, 7], [5, 6, 7, 9], 15, 4, 1, 0, sharded=False)
    assert [(r.positions, r.src_row, r.dst_row, r.tokens) for r in runs] == [
        ((0, 1, 2), 0, 20, 12),
        ((3,), 28, 36, 3),
    ]


@pytest.mark.gloo
def test_decode_rebuilds_every_level_byte_for_byte() -> None:
    """Levels 0, 2, 3 (mixed trace) and 4, 5 (long requests) at cp_size 1, 2 and 4: one
    4-rank prefill spawn, one decode process."""
    jobs = []
    for cp_size in (1, 2, 4):
        jobs += [pd_job("mixed", cp_size, (0, 2, 3)), pd_job("long", cp_size, (4, 5))]
    reports, _ = run_pd(TINY, jobs)
    for job, report in zip(jobs, reports, strict=True):
        assert report.ok, [r for r in report.requests if not r.ok]
        for result in report.requests:
            assert result.kv_equal and result.decode_max_abs_diff == 0.0
            assert all(result.released_by_rank)
            assert len(result.bytes_by_rank) == job.deploy.cp_size
    # cp_size 4: each rank sends about a quarter, the pages it owns. Dealt pages (levels
    # 0-4) balance within one page per request; compute-owner pages (level 5) within two
    # pages per chunk, since page-aligned blocks differ by one page.
    page_bytes = kv_bytes_per_page(TINY, make_deploy().index_k_dtype, 4)
    for job, report in zip(jobs[-2:], reports[-2:], strict=True):
        for result in report.requests:
            chunks = sum(r.rid == result.rid for b in job.batches for r in b.requests)
            slack = 2 * chunks if result.level == 5 else 1
            total = sum(result.bytes_by_rank)
            assert max(result.bytes_by_rank) <= total / 4 + slack * page_bytes, result


@pytest.mark.gloo
def test_failed_and_timed_out_transfers_leave_no_request_ready() -> None:
    faults = PdFaults(fail=("a", 1), stall=("b", 0))
    # NOTE: after a rejected write Mooncake's TCP transport re-establishes the session, and
    # the rank's next write took ~4 s here; the timeout leaves ample room for that.
    (report,), _ = run_pd(TINY, [pd_job("pd_small", 2, (2,))], timeout_s=12.0, faults=faults)
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
def test_a_failed_transfer_can_be_retried() -> None:
    (report,), _ = run_pd(
        TINY, [pd_job("pd_small", 2, (5,))], faults=PdFaults(fail=("a", 0)), retries=1
    )
    assert report.ok
    retried = next(r for r in report.requests if r.rid == "a")
    assert retried.kv_equal and any("attempt 0" in e for e in retried.errors)


@pytest.mark.gloo
def test_decode_server_killed_mid_transfer_marks_nothing_ready() -> None:
    (report,), _ = run_pd(TINY, [pd_job("pd_small", 2, (2,))], die_on_done_of="j0/0/b")
    assert not report.ok
    assert report.errors and "decode server unreachable" in report.errors[0]
    for result in report.requests:  # every request was in flight: none was acknowledged
        assert not result.ready
        assert not any(result.released_by_rank)  # prefill keeps the pages for a retry
        assert any("unreachable" in e for e in result.errors)


def test_failed_attempt_pages_stay_quarantined_until_every_sender_settled() -> None:
    """In-process decode server, handlers called directly: a late write from a failed
    attempt can never land in pages a retry or another request holds."""
    server = DecodeServer(TINY, 4, make_deploy().index_k_dtype, 64, 5.0, b"k")
    try:
        first = server._on_alloc(Alloc("r", 0, 10, 3, senders=2))
        assert isinstance(first, AllocReply)
        free_before = server.scheduler.allocator.num_free_pages
        server._on_fail(Fail("r", 0, 0, "write rejected"))
        assert server.scheduler.allocator.num_free_pages == free_before  # rank 1 may still write
        retry = server._on_alloc(Alloc("r", 1, 10, 3, senders=2))
        assert isinstance(retry, AllocReply)
        assert set(retry.page_table).isdisjoint(first.page_table)
        verdict = server._on_await(Await("r", 0, 1))  # rank 1 is done with attempt 0
        assert not verdict.ready
        assert server.scheduler.allocator.num_free_pages == free_before - len(
            retry.page_table
        ) + len(first.page_table)
    finally:
        server.transport.close()
        server.listener.close()
