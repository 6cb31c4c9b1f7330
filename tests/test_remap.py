"""Remap tables and owner-balanced allocation: properties over random page tables."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv_core.planning import (
    BatchSpec,
    PageAllocator,
    RequestSpec,
    Scheduler,
    ViewPlan,
    owner_of_page,
    slot_view_plan,
    unique_view_plan,
)

Case = tuple[list[list[int]], list[int], int, int]


@st.composite
def page_tables(draw: st.DrawFn) -> Case:
    """Random requests over a small page space, sharing pages like prefix hits do."""
    page_size = draw(st.sampled_from([1, 4, 16]))
    cp_size = draw(st.integers(1, 5))
    tables, seq_lens = [], []
    for _ in range(draw(st.integers(1, 5))):
        seq_len = draw(st.integers(1, 6 * page_size))
        pages = -(-seq_len // page_size)
        tables.append(draw(st.lists(st.integers(0, 40), min_size=pages, max_size=pages)))
        seq_lens.append(seq_len)
    return tables, seq_lens, page_size, cp_size


def flat(tables: list[list[int]]) -> np.ndarray:
    return np.array([p for t in tables for p in t], dtype=np.int64)


def assert_view_reads_the_page_table(
    plan: ViewPlan, tables: list[list[int]], seq_lens: list[int]
) -> None:
    for owner, pages in enumerate(plan.pages_by_owner):
        assert all(owner_of_page(int(p), plan.cp_size) == owner for p in pages)
    start = 0
    for table, seq_len in zip(tables, seq_lens, strict=True):
        rows = plan.key_rows(slice(start, start + len(table)), seq_len)
        start += len(table)
        assert len(rows) == seq_len
        for pos, row in enumerate(rows.tolist()):
            assert plan.page_of_view_row(row) == table[pos // plan.page_size]
            assert row % plan.page_size == pos % plan.page_size
            assert row < plan.view_tokens


@settings(max_examples=150, deadline=None)
@given(page_tables())
def test_slot_remap_reads_every_position_from_its_page(case: Case) -> None:
    tables, seq_lens, page_size, cp_size = case
    plan = slot_view_plan(flat(tables), page_size, cp_size)
    assert_view_reads_the_page_table(plan, tables, seq_lens)
    assert sum(len(p) for p in plan.pages_by_owner) == sum(len(t) for t in tables)


@settings(max_examples=150, deadline=None)
@given(page_tables())
def test_unique_remap_holds_each_page_once(case: Case) -> None:
    tables, seq_lens, page_size, cp_size = case
    plan = unique_view_plan(flat(tables), page_size, cp_size)
    assert_view_reads_the_page_table(plan, tables, seq_lens)
    sent = [int(p) for pages in plan.pages_by_owner for p in pages]
    assert sorted(sent) == sorted({p for t in tables for p in t})
    assert plan.view_tokens <= slot_view_plan(flat(tables), page_size, cp_size).view_tokens


@settings(max_examples=100, deadline=None)
@given(
    cp_size=st.integers(1, 8),
    page_size=st.sampled_from([1, 4, 16]),
    chunks=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 60)), min_size=1, max_size=12),
)
def test_dealt_allocation_balances_each_requests_pages_across_owners(
    cp_size: int, page_size: int, chunks: list[tuple[int, int]]
) -> None:
    scheduler = Scheduler(cp_size * 1024, page_size, cp_size)
    seq_lens: dict[str, int] = {}
    for index, (request, extend_len) in enumerate(chunks):
        rid = f"r{request}"
        held = seq_lens.get(rid, 0)
        scheduler.schedule(BatchSpec(index, (RequestSpec(rid, held, extend_len),)))
        seq_lens[rid] = held + extend_len
    scheduler.allocator.check_invariants()
    for rid in seq_lens:
        per_owner = [0] * cp_size
        for page in scheduler.page_table(rid):
            per_owner[owner_of_page(int(page), cp_size)] += 1
        assert max(per_owner) - min(per_owner) <= 1, (rid, per_owner)


def test_compute_owner_allocation_takes_pages_from_the_named_owners() -> None:
    allocator = PageAllocator(16, 4, num_owners=4)
    allocator.allocate("a", 3, owners=[2, 2, 3])
    assert [owner_of_page(int(p), 4) for p in allocator.page_table("a")] == [2, 2, 3]
