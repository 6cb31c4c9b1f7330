"""Phases 4 and 5 on host metadata: direct writes stay on owned pages, owner-aware
allocation follows the compute owner, local queries follow real segment lengths."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv_core.config import DeploymentConfig
from cpkv_core.planning.allocation import allocate_batch, pages_for_trace, with_first_page_owners
from cpkv_core.planning.allocator import PageAllocator
from cpkv_core.planning.batch import BatchSpec, RequestSpec
from cpkv_core.planning.execution import (
    ExecutionPlan,
    KvReadStrategy,
    KvWriteStrategy,
    SplitStrategy,
)
from cpkv_core.planning.ownership import owner_of_loc
from cpkv_core.planning.split_page_aligned import local_pair_lengths, request_pages
from cpkv_core.runtime.layout import build_batch_split, build_layout, build_write_plan
from phases.gate import Gate
from phases.ids import PhaseId

DIRECT = ExecutionPlan(
    split=SplitStrategy.PAGE_ALIGNED_ZIGZAG,
    kv_write=KvWriteStrategy.COMPUTE_OWNER_DIRECT,
    kv_read=KvReadStrategy.MATERIALIZED_SLOT,
    output=ExecutionPlan.baseline(DeploymentConfig().cp_mode).output,
)


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
def test_direct_write_touches_only_pages_its_rank_owns(case: tuple) -> None:  # type: ignore[type-arg]
    batches, cp_size, page_size = case
    allocator = PageAllocator(pages_for_trace(batches, page_size, cp_size), page_size, cp_size)
    for batch in batches:
        split = build_batch_split(SplitStrategy.PAGE_ALIGNED_ZIGZAG, batch, cp_size, page_size)
        allocate_batch(allocator, batch, DIRECT)
        current = [
            loc for r in batch.requests for loc in allocator.locs(r.rid, r.prefix_len, r.seq_len)
        ]
        written: list[int] = []
        for rank in range(cp_size):
            local = split.local_token_indices[rank]
            plan = build_write_plan(
                KvWriteStrategy.COMPUTE_OWNER_DIRECT, current, local, rank, cp_size, page_size
            )
            locs = plan.written_locs.tolist()
            assert all(owner_of_loc(loc, page_size, cp_size) == rank for loc in locs)
            written += locs
        assert sorted(written) == sorted(current)


def test_direct_write_refuses_a_foreign_page() -> None:
    with pytest.raises(RuntimeError, match="does not own"):
        build_write_plan(KvWriteStrategy.COMPUTE_OWNER_DIRECT, [0, 1, 4], [2], 0, 2, 4)


def test_local_queries_follow_real_segment_lengths() -> None:
    """Page-aligned segments are unequal; each request's local rows are exactly its two
    segments, never half of the rank's tokens."""
    cp_size, page_size = 2, 4
    batch = BatchSpec(0, (RequestSpec("a", 0, 31), RequestSpec("b", 0, 17)))
    allocator = PageAllocator(64, page_size, cp_size)
    split = build_batch_split(SplitStrategy.PAGE_ALIGNED_ZIGZAG, batch, cp_size, page_size)
    allocate_batch(allocator, batch, DIRECT)
    tokens = [[0] * r.extend_len for r in batch.requests]
    unequal = False
    for rank in range(cp_size):
        layout = build_layout(batch, DIRECT, split, rank, tokens, allocator)
        for index, rows in enumerate(layout.requests):
            first, second = local_pair_lengths(split, rank, index)
            unequal |= first != second
            assert rows.local_rows.numel() == first + second
    assert unequal


def test_phase5_follows_its_own_earlier_chunk_but_not_a_foreign_page() -> None:
    """A chunk resuming mid-page may write directly only if the page is on its compute
    owner: true after a phase-5 chunk, false after a balanced (phase 2) one."""
    deploy = DeploymentConfig(cp_size=2, page_size=4)
    enabled = frozenset(PhaseId)
    first = BatchSpec(0, (RequestSpec("a", 0, 30),))
    second = BatchSpec(1, (RequestSpec("a", 30, 30),))
    gate = Gate(enabled, deploy)
    for plan_first, want in ((DIRECT, 5), (gate.plan(first).plan, 5)):
        allocator = PageAllocator(64, 4, 2)
        allocate_batch(allocator, first, plan_first)
        assert gate.plan(with_first_page_owners(second, allocator)).phase == want
    balanced = dataclasses.replace(DIRECT, kv_write=KvWriteStrategy.OWNER_FILTERED)
    allocator = PageAllocator(64, 4, 2)
    allocate_batch(allocator, first, balanced)  # 8 pages dealt 0,1,0,...: page 7 on rank 1
    plan = gate.plan(with_first_page_owners(second, allocator))
    assert plan.phase == 4
    assert plan.decisions[4].reasons == ("OWNER_MISMATCH rid=a page=7 owner=1 compute_owner=0",)
    assert request_pages(30, 30, 4) == 8
