"""The scheduler and its allocator: page tables, mid-page continuation, prefix sharing,
release, all-or-nothing batches, compute-owner allocation."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv_core.planning import (
    NO_OWNER,
    BatchSpec,
    OutOfPagesError,
    OwnerPolicy,
    RequestSpec,
    ScheduledBatch,
    ScheduledRequest,
    ScheduleError,
    Scheduler,
    compute_owner_of_pages,
    owner_of_page,
    pages_for_trace,
)
from cpkv_core.traces import validate_trace

PAGE_SIZES = [1, 4, 16]


class Alloc:
    """A scheduler fed one request per batch, with the allocator's queries at hand."""

    def __init__(self, num_pages: int = 64, page_size: int = 4, cp_size: int = 1) -> None:
        self.scheduler = Scheduler(num_pages, page_size, cp_size)
        self.allocator = self.scheduler.allocator
        self.page_size = page_size
        self.batches = 0

    def allocate(self, spec: RequestSpec) -> ScheduledRequest:
        (req,) = self.scheduler.schedule(BatchSpec(self.batches, (spec,))).requests
        self.batches += 1
        return req

    def page_table(self, rid: str) -> tuple[int, ...]:
        return tuple(int(p) for p in self.scheduler.page_table(rid))

    def locs(self, rid: str, start: int, end: int) -> tuple[int, ...]:
        table, size = self.page_table(rid), self.page_size
        return tuple(table[p // size] * size + p % size for p in range(start, end))

    def req_to_token(self, rid: str) -> tuple[int, ...]:
        return self.locs(rid, 0, self.scheduler.seq_len(rid))

    def __contains__(self, rid: str) -> bool:
        return rid in self.scheduler

    def release(self, rid: str) -> None:
        self.scheduler.release(rid)

    def refcount(self, page: int) -> int:
        return self.allocator.refcount(page)

    def check_invariants(self) -> None:
        self.allocator.check_invariants()

    @property
    def num_pages(self) -> int:
        return self.allocator.num_pages

    @property
    def num_free_pages(self) -> int:
        return self.allocator.num_free_pages

    @property
    def num_pages_in_use(self) -> int:
        return self.allocator.num_pages_in_use

    @property
    def pages_in_use(self) -> frozenset[int]:
        return self.allocator.pages_in_use


def make_allocator(num_pages: int = 64, page_size: int = 4) -> Alloc:
    return Alloc(num_pages, page_size)


def snapshot(alloc: Alloc, rids: list[str]) -> object:
    """Everything observable about ``alloc``, for all-or-nothing checks."""
    tables = {
        r: (alloc.page_table(r), alloc.scheduler.seq_len(r)) for r in rids if r in alloc.scheduler
    }
    allocator = alloc.allocator
    counts = tuple(allocator.refcount(p) for p in range(allocator.num_pages))
    return tables, counts, allocator.num_free_pages, allocator.pages_in_use


# -- basic allocation ----------------------------------------------------------------------


def test_fresh_allocation_takes_lowest_free_pages_in_order() -> None:
    alloc = make_allocator(page_size=4)
    alloc.allocate(RequestSpec("a", 0, 9))
    alloc.allocate(RequestSpec("b", 0, 4))
    assert alloc.page_table("a") == (0, 1, 2)
    assert alloc.page_table("b") == (3,)
    assert (alloc.scheduler.seq_len("a"), alloc.scheduler.seq_len("b")) == (9, 4)
    assert alloc.allocator.num_pages_in_use == 4 and alloc.allocator.num_free_pages == 60
    assert alloc.allocator.pages_in_use == frozenset({0, 1, 2, 3})
    alloc.allocator.check_invariants()


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_scheduled_request_carries_its_page_table_and_chunk(page_size: int) -> None:
    alloc = make_allocator(page_size=page_size)
    alloc.allocate(RequestSpec("x", 0, 1))  # so "a" does not start at page 0
    req = alloc.allocate(RequestSpec("a", 0, 2 * page_size + 1))
    assert (req.prefix_len, req.extend_len, req.seq_len) == (
        0,
        2 * page_size + 1,
        2 * page_size + 1,
    )
    assert tuple(req.page_table) == alloc.page_table("a") == (1, 2, 3)
    assert not req.page_table.flags.writeable
    assert req.resume_page_owner == NO_OWNER


@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("first", [1, 3, 15, 16, 17])
def test_continuation_mid_page_fills_partial_page_first(page_size: int, first: int) -> None:
    alloc = make_allocator(page_size=page_size)
    alloc.allocate(RequestSpec("a", 0, first))
    before = alloc.page_table("a")
    alloc.allocate(RequestSpec("other", 0, 1))  # takes the next free page in between
    req = alloc.allocate(RequestSpec("a", first, page_size + 2))
    table = alloc.page_table("a")
    assert table[: len(before)] == before
    assert len(table) == -(-(first + page_size + 2) // page_size)
    assert alloc.req_to_token("a")[:first] == tuple(
        before[p // page_size] * page_size + p % page_size for p in range(first)
    )
    if first % page_size:  # the partly filled page holds the next positions
        assert alloc.locs("a", first, first + 1)[0] // page_size == before[-1]
        assert req.resume_page_owner == 0  # one owner
    else:
        assert req.resume_page_owner == NO_OWNER
    alloc.allocator.check_invariants()


# -- prefix sharing and release -----------------------------------------------------------


def test_prefix_sharing_shares_pages_and_counts_references() -> None:
    alloc = make_allocator(page_size=4)
    alloc.allocate(RequestSpec("a", 0, 10))  # pages 0, 1, 2 (2 partly filled)
    alloc.allocate(RequestSpec("b", 8, 3, prefix_from="a"))
    assert alloc.page_table("b") == (0, 1, 3)
    assert alloc.req_to_token("b")[:8] == alloc.req_to_token("a")[:8]
    assert [alloc.refcount(p) for p in range(5)] == [2, 2, 1, 1, 0]
    alloc.allocate(RequestSpec("c", 4, 1, prefix_from="b"))
    assert alloc.page_table("c") == (0, 4)
    assert alloc.refcount(0) == 3
    alloc.check_invariants()


def test_release_frees_only_unshared_pages() -> None:
    alloc = make_allocator(num_pages=8, page_size=4)
    alloc.allocate(RequestSpec("a", 0, 10))
    alloc.allocate(RequestSpec("b", 8, 3, prefix_from="a"))
    alloc.release("a")
    assert "a" not in alloc
    assert alloc.pages_in_use == frozenset({0, 1, 3})
    assert [alloc.refcount(p) for p in (0, 1, 2, 3)] == [1, 1, 0, 1]
    alloc.allocate(RequestSpec("c", 0, 1))
    assert alloc.page_table("c") == (2,)  # the freed page is the lowest free one
    alloc.release("b")
    alloc.release("c")
    assert alloc.num_free_pages == 8 and alloc.pages_in_use == frozenset()
    alloc.check_invariants()


def test_released_rid_can_start_again_as_new_request() -> None:
    alloc = make_allocator(num_pages=2, page_size=4)
    alloc.allocate(RequestSpec("a", 0, 8))
    alloc.release("a")
    alloc.allocate(RequestSpec("a", 0, 4))
    assert alloc.page_table("a") == (0,)


# -- errors, all or nothing -----------------------------------------------------------------


def test_out_of_pages_leaves_state_unchanged() -> None:
    alloc = make_allocator(num_pages=4, page_size=4)
    alloc.allocate(RequestSpec("a", 0, 6))
    alloc.allocate(RequestSpec("b", 4, 1, prefix_from="a"))
    before = snapshot(alloc, ["a", "b", "c"])
    with pytest.raises(OutOfPagesError, match=r"need 2 more, 1 free of 4; raise num_pages"):
        alloc.allocate(RequestSpec("a", 6, 7))
    with pytest.raises(OutOfPagesError, match="need 2 more"):
        alloc.allocate(RequestSpec("c", 4, 5, prefix_from="a"))
    assert snapshot(alloc, ["a", "b", "c"]) == before
    alloc.check_invariants()


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        (RequestSpec("a", 4, 1), "prefix_len must be 10, got 4"),
        (RequestSpec("a", 10, 1, prefix_from="a"), "prefix_from is not allowed"),
        (RequestSpec("b", 4, 1), "no prefix_from"),
        (RequestSpec("b", 4, 1, prefix_from="zzz"), "'zzz' is not a known request"),
        (RequestSpec("b", 6, 1, prefix_from="a"), "not a multiple of page_size=4"),
        (RequestSpec("b", 0, 1, prefix_from="a"), "prefix_len is 0"),
        (RequestSpec("b", 12, 1, prefix_from="a"), "exceeds the 10 tokens 'a' has"),
        (RequestSpec("b", 0, 0), "extend_len: must be >= 1"),
    ],
)
def test_rejects_inconsistent_request_and_changes_nothing(spec: RequestSpec, words: str) -> None:
    alloc = make_allocator(page_size=4)
    alloc.allocate(RequestSpec("a", 0, 10))
    before = snapshot(alloc, ["a", "b"])
    with pytest.raises(ScheduleError, match=words):
        alloc.allocate(spec)
    assert snapshot(alloc, ["a", "b"]) == before


def test_rejects_unknown_rid_and_bad_page() -> None:
    alloc = make_allocator(num_pages=2)
    with pytest.raises(ValueError, match="unknown request 'x'"):
        alloc.release("x")
    with pytest.raises(ValueError, match=r"page must be in \[0, 2\)"):
        alloc.refcount(2)
    with pytest.raises(ValueError, match="page_size must be >= 1"):
        Scheduler(4, 0)


# -- pages_for_trace and the property test ---------------------------------------------------


def test_pages_for_trace_counts_shared_prefix_pages_once_per_owner() -> None:
    batches = (
        BatchSpec(0, (RequestSpec("a", 0, 10),)),
        BatchSpec(1, (RequestSpec("a", 10, 3), RequestSpec("b", 8, 1, prefix_from="a"))),
    )
    # a: 13 tokens -> 4 pages; b: 2 shared + 1 own; one spare page per owner.
    assert pages_for_trace(batches, page_size=4, cp_size=1) == 6
    assert pages_for_trace(batches, page_size=4, cp_size=3) == 18


@st.composite
def traces(draw: st.DrawFn) -> tuple[int, tuple[BatchSpec, ...]]:
    """A valid trace: continuations, fresh requests and page-aligned prefix hits."""
    page_size = draw(st.sampled_from(PAGE_SIZES))
    tokens: dict[str, int] = {}
    batches: list[BatchSpec] = []
    for index in range(draw(st.integers(1, 5))):
        known = sorted(tokens)
        cont = draw(st.lists(st.sampled_from(known), unique=True)) if known else []
        requests = [RequestSpec(r, tokens[r], draw(st.integers(1, 40))) for r in cont]
        for k in range(draw(st.integers(0 if cont else 1, 3))):
            rid = f"r{index}.{k}"
            sources = [r for r in known if tokens[r] >= page_size]
            share: bool = draw(st.booleans())
            if sources and share:
                src = draw(st.sampled_from(sources))
                prefix = page_size * draw(st.integers(1, tokens[src] // page_size))
                requests.append(RequestSpec(rid, prefix, draw(st.integers(1, 40)), src))
            else:
                requests.append(RequestSpec(rid, 0, draw(st.integers(1, 40))))
        batches.append(BatchSpec(index, tuple(draw(st.permutations(requests)))))
        tokens.update((r.rid, r.seq_len) for r in requests)
    return page_size, tuple(batches)


def writers_of(batches: tuple[BatchSpec, ...]) -> dict[str, list[str]]:
    """For each rid and position, the rid that first wrote the token there."""
    writers: dict[str, list[str]] = {}
    for batch in batches:
        for r in batch.requests:
            history = (
                writers[r.prefix_from][: r.prefix_len] if r.prefix_from else writers.get(r.rid, [])
            )
            writers[r.rid] = history + [r.rid] * r.extend_len
    return writers


@settings(max_examples=150, deadline=None)
@given(traces())
def test_locs_are_distinct_except_shared_prefixes(trace: tuple[int, tuple[BatchSpec, ...]]) -> None:
    page_size, batches = trace
    validate_trace(batches, page_size)
    needed = pages_for_trace(batches, page_size, 1)
    alloc = Alloc(needed, page_size)
    for batch in batches:
        alloc.scheduler.schedule(batch)
        alloc.check_invariants()
    assert alloc.num_pages_in_use == needed - 1 and alloc.num_free_pages == 1

    loc_of: dict[tuple[str, int], int] = {}
    for rid, writers in writers_of(batches).items():
        locs = alloc.req_to_token(rid)
        assert len(locs) == len(writers)
        for pos, (writer, loc) in enumerate(zip(writers, locs, strict=True)):
            assert loc_of.setdefault((writer, pos), loc) == loc  # same token, same loc
    assert len(set(loc_of.values())) == len(loc_of)  # different tokens, different locs


@settings(max_examples=50, deadline=None)
@given(traces(), st.randoms(use_true_random=False))
def test_releasing_everything_frees_every_page(
    trace: tuple[int, tuple[BatchSpec, ...]], rnd: random.Random
) -> None:
    page_size, batches = trace
    alloc = Alloc(pages_for_trace(batches, page_size, 1), page_size)
    rids: list[str] = []
    for batch in batches:
        alloc.scheduler.schedule(batch)
        rids += [r.rid for r in batch.requests if r.rid not in rids]
    rnd.shuffle(rids)
    for rid in rids:
        alloc.release(rid)
        alloc.check_invariants()
    assert alloc.num_free_pages == alloc.num_pages and alloc.pages_in_use == frozenset()


# -- whole batches: atomic, owners, compute-owner allocation ----------------------------------


def test_a_batch_that_runs_out_of_pages_changes_nothing() -> None:
    alloc = Alloc(num_pages=5, page_size=4)
    alloc.allocate(RequestSpec("a", 0, 6))  # 2 pages
    before = snapshot(alloc, ["a", "b", "c"])
    batch = BatchSpec(9, (RequestSpec("b", 0, 8), RequestSpec("a", 6, 2), RequestSpec("c", 0, 8)))
    with pytest.raises(OutOfPagesError):
        alloc.scheduler.schedule(batch)  # b and a fit, c does not: b and a are undone
    assert snapshot(alloc, ["a", "b", "c"]) == before
    alloc.check_invariants()


def test_schedule_error_names_the_batch_and_field() -> None:
    alloc = Alloc()
    alloc.allocate(RequestSpec("a", 0, 5))
    bad = BatchSpec(7, (RequestSpec("x", 0, 3), RequestSpec("a", 4, 1)))
    with pytest.raises(ScheduleError, match=r"batch 7: requests\[1\]\.prefix_len: .* must be 5"):
        alloc.scheduler.schedule(bad)
    assert "x" not in alloc.scheduler


@pytest.mark.parametrize("cp_size", [2, 3, 4])
@pytest.mark.parametrize("page_size", [1, 4])
def test_compute_owner_policy_puts_each_page_on_its_compute_owner(
    cp_size: int, page_size: int
) -> None:
    scheduler = Scheduler(200 * cp_size, page_size, cp_size)
    lens = [2 * cp_size * page_size + 3, 4 * cp_size * page_size]
    batch = BatchSpec(0, tuple(RequestSpec(f"r{i}", 0, n) for i, n in enumerate(lens)))
    scheduled = scheduler.schedule(batch, OwnerPolicy.COMPUTE_OWNER)
    assert scheduled.on_compute_owners
    want = compute_owner_of_pages(lens, [0, 0], cp_size, page_size)
    for req, owners in zip(scheduled.requests, want, strict=True):
        assert [owner_of_page(int(p), cp_size) for p in req.page_table] == list(owners)


def test_compute_owner_policy_falls_back_to_dealt_for_a_short_request() -> None:
    scheduler = Scheduler(64, 4, 2)
    batch = BatchSpec(0, (RequestSpec("long", 0, 64), RequestSpec("short", 0, 5)))
    scheduled = scheduler.schedule(batch, OwnerPolicy.COMPUTE_OWNER)
    assert not scheduled.on_compute_owners
    owners = [owner_of_page(int(p), 2) for p in scheduled.requests[0].page_table]
    assert owners == [0, 1] * 8  # dealt in turn


def test_resuming_in_a_page_owned_by_another_rank_is_not_on_compute_owners() -> None:
    scheduler = Scheduler(64, 4, 2)
    scheduler.schedule(BatchSpec(0, (RequestSpec("a", 0, 6),)))  # pages on owners 0, 1
    scheduled = scheduler.schedule(
        BatchSpec(1, (RequestSpec("a", 6, 40),)), OwnerPolicy.COMPUTE_OWNER
    )
    assert scheduled.requests[0].resume_page_owner == 1
    assert not scheduled.on_compute_owners
    assert scheduled.current_pages == (11,)  # positions 6..45: pages 1..11
    assert np.array_equal(scheduled.new_pages, scheduled.requests[0].page_table[2:])


# -- rollback: a batch whose run failed is undone as a whole ----------------------------------


def _same_schedule(a: ScheduledBatch, b: ScheduledBatch) -> bool:
    return (
        np.array_equal(a.new_pages, b.new_pages)
        and a.on_compute_owners == b.on_compute_owners
        and all(
            np.array_equal(x.page_table, y.page_table)
            and (x.rid, x.prefix_len, x.resume_page_owner)
            == (y.rid, y.prefix_len, y.resume_page_owner)
            for x, y in zip(a.requests, b.requests, strict=True)
        )
    )


@settings(max_examples=100, deadline=None)
@given(traces(), st.sampled_from([1, 2, 3]), st.sampled_from(list(OwnerPolicy)))
def test_rollback_restores_the_state_and_a_rerun_schedules_alike(
    trace: tuple[int, tuple[BatchSpec, ...]], cp_size: int, policy: OwnerPolicy
) -> None:
    page_size, batches = trace
    scheduler = Scheduler(pages_for_trace(batches, page_size, cp_size), page_size, cp_size)
    for batch in batches:
        before = scheduler.state()
        first = scheduler.schedule(batch, policy)
        scheduler.rollback(batch.batch)
        assert scheduler.state() == before
        scheduler.allocator.check_invariants()
        assert _same_schedule(scheduler.schedule(batch, policy), first)


def test_only_the_last_batch_can_be_rolled_back() -> None:
    scheduler = Scheduler(64, 4, 2)
    scheduler.schedule(BatchSpec(0, (RequestSpec("a", 0, 6),)))
    scheduler.schedule(BatchSpec(1, (RequestSpec("a", 6, 4),)))
    with pytest.raises(RuntimeError, match=r"cannot roll back batch 0: .*now: batch 1"):
        scheduler.rollback(0)
    scheduler.rollback(1)
    with pytest.raises(RuntimeError, match=r"cannot roll back batch 1: .*now: none"):
        scheduler.rollback(1)
    assert scheduler.seq_len("a") == 6
