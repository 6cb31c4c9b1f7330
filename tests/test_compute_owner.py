"""Phases 4 and 5 on host metadata: direct writes stay on owned pages, owner-aware
allocation follows the compute owner, local queries follow real segment lengths."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv_core.config import DeploymentConfig
from cpkv_core.planning import (
    BatchSpec,
    ExecutionPlan,
    HostPlan,
    KvReadStrategy,
    KvWriteStrategy,
    OwnerPolicy,
    RequestSpec,
    ScheduledBatch,
    Scheduler,
    SplitStrategy,
    build_host_plan,
    owner_of_loc,
    pages_for_trace,
    request_pages,
)
from cpkv_core.planning.split_page_aligned import (
    build_page_aligned_zigzag_split,
    local_pair_lengths,
)
from phases import Gate, PhaseId

DIRECT = ExecutionPlan(
    split=SplitStrategy.PAGE_ALIGNED_ZIGZAG,
    kv_write=KvWriteStrategy.COMPUTE_OWNER_DIRECT,
    kv_read=KvReadStrategy.MATERIALIZED_UNIQUE,
    output=ExecutionPlan.baseline(DeploymentConfig().cp_mode).output,
)


def written_locs(host: HostPlan) -> list[int]:
    """The logical locs a host plan writes, expanded on the host."""
    starts, counts = host.table("write_loc0"), host.table("write_count")
    return [int(s) + i for s, n in zip(starts, counts, strict=True) for i in range(int(n))]


def current_locs(batch: ScheduledBatch) -> list[int]:
    ps = batch.page_size
    return [
        int(r.page_table[p // ps]) * ps + p % ps
        for r in batch.requests
        for p in range(r.prefix_len, r.seq_len)
    ]


@st.composite
def long_batches(draw: st.DrawFn) -> tuple[list[BatchSpec], int, int]:
    """Chunked prefill of long requests: every chunk spans at least 2*cp_size pages."""
    cp_size = draw(st.integers(1, 4))
    page_size = draw(st.sampled_from([1, 4, 16]))
    minimum = 2 * cp_size * page_size
    batches, held = [], {}
    for index in range(draw(st.integers(1, 3))):
        requests = []
        for rid in draw(st.lists(st.sampled_from("abc"), min_size=1, max_size=3, unique=True)):
            extend = draw(st.integers(minimum, minimum + 3 * page_size))
            requests.append(RequestSpec(rid, held.get(rid, 0), extend))
            held[rid] = held.get(rid, 0) + extend
        batches.append(BatchSpec(index, tuple(requests)))
    return batches, cp_size, page_size


@settings(max_examples=60, deadline=None)
@given(long_batches())
def test_direct_write_touches_only_pages_its_rank_owns(
    case: tuple[list[BatchSpec], int, int],
) -> None:
    batches, cp_size, page_size = case
    scheduler = Scheduler(pages_for_trace(batches, page_size, cp_size), page_size, cp_size)
    for batch in batches:
        scheduled = scheduler.schedule(batch, OwnerPolicy.COMPUTE_OWNER)
        if not scheduled.on_compute_owners:
            continue  # a chunk resuming in a foreign page: phase 5 falls back
        written: list[int] = []
        for rank in range(cp_size):
            locs = written_locs(build_host_plan(scheduled, DIRECT, rank))
            assert all(owner_of_loc(loc, page_size, cp_size) == rank for loc in locs)
            written += locs
        assert sorted(written) == sorted(current_locs(scheduled))


def test_direct_write_refuses_a_foreign_page() -> None:
    scheduler = Scheduler(64, 4, 2)
    dealt = scheduler.schedule(BatchSpec(0, (RequestSpec("a", 0, 30),)), OwnerPolicy.DEALT)
    with pytest.raises(RuntimeError, match="does not own"):
        build_host_plan(dealt, DIRECT, 0)


def test_local_queries_follow_real_segment_lengths() -> None:
    """Page-aligned segments are unequal; each request's local rows are exactly its two
    segments, never half of the rank's tokens."""
    cp_size, page_size = 2, 4
    batch = BatchSpec(0, (RequestSpec("a", 0, 31), RequestSpec("b", 0, 17)))
    scheduled = Scheduler(64, page_size, cp_size).schedule(batch, OwnerPolicy.COMPUTE_OWNER)
    split = build_page_aligned_zigzag_split([31, 17], [0, 0], cp_size, page_size)
    unequal = False
    for rank in range(cp_size):
        host = build_host_plan(scheduled, DIRECT, rank)
        for req in host.attended:
            first, second = local_pair_lengths(split, rank, req.index)
            unequal |= first != second
            assert req.row_end - req.row_start == first + second
    assert unequal


def test_phase5_follows_its_own_earlier_chunk_but_not_a_foreign_page() -> None:
    """A chunk resuming mid-page may write directly only if the page is on its compute
    owner: true after a compute-owner chunk, false after a dealt (phase 2) one."""
    deploy = DeploymentConfig(cp_size=2, page_size=4)
    first = BatchSpec(0, (RequestSpec("a", 0, 30),))
    second = BatchSpec(1, (RequestSpec("a", 30, 30),))
    gate = Gate(frozenset(PhaseId), deploy)
    scheduler = Scheduler(64, 4, 2)
    assert gate.decide(scheduler.schedule(first, gate.owner_policy())).phase == 5
    assert gate.decide(scheduler.schedule(second, gate.owner_policy())).phase == 5
    scheduler = Scheduler(64, 4, 2)
    scheduler.schedule(first, OwnerPolicy.DEALT)  # 8 pages dealt 0,1,0,...: page 7 on rank 1
    plan = gate.decide(scheduler.schedule(second, gate.owner_policy()))
    assert plan.phase == 4
    assert [str(r) for r in plan.decisions[4].reasons] == [
        "OWNER_MISMATCH rid=a page=7 owner=1 compute_owner=0"
    ]
    assert request_pages(30, 30, 4) == 8
    assert plan.plan.split is SplitStrategy.PAGE_ALIGNED_ZIGZAG
