"""Logical page allocator: page tables, mid-page continuation, prefix sharing, release."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv_core.planning.allocator import OutOfPagesError, PageAllocator, pages_needed_for_trace
from cpkv_core.planning.batch import BatchSpec, RequestSpec
from cpkv_core.planning.tokens import TokenLedger, token_id
from cpkv_core.traces.trace import validate_trace

PAGE_SIZES = [1, 4, 16]


def make_allocator(num_pages: int = 64, page_size: int = 4) -> PageAllocator:
    return PageAllocator(num_pages, page_size)


def snapshot(alloc: PageAllocator, rids: list[str]) -> object:
    """Everything observable about ``alloc``, for all-or-nothing checks."""
    tables = {r: (alloc.page_table(r), alloc.seq_len(r)) for r in rids if r in alloc}
    counts = tuple(alloc.refcount(p) for p in range(alloc.num_pages))
    return tables, counts, alloc.num_free_pages, alloc.pages_in_use


# -- basic allocation ----------------------------------------------------------------------


def test_fresh_allocation_takes_lowest_free_pages_in_order() -> None:
    alloc = make_allocator(page_size=4)
    alloc.allocate(RequestSpec("a", 0, 9))
    alloc.allocate(RequestSpec("b", 0, 4))
    assert alloc.page_table("a") == (0, 1, 2)
    assert alloc.page_table("b") == (3,)
    assert (alloc.seq_len("a"), alloc.seq_len("b")) == (9, 4)
    assert alloc.num_pages_in_use == 4 and alloc.num_free_pages == 60
    assert alloc.pages_in_use == frozenset({0, 1, 2, 3})
    alloc.check_invariants()


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_req_to_token_maps_positions_through_page_table(page_size: int) -> None:
    alloc = make_allocator(page_size=page_size)
    alloc.allocate(RequestSpec("x", 0, 1))  # so "a" does not start at page 0
    alloc.allocate(RequestSpec("a", 0, 2 * page_size + 1))
    table = alloc.page_table("a")
    want = tuple(
        table[p // page_size] * page_size + p % page_size for p in range(2 * page_size + 1)
    )
    assert alloc.req_to_token("a") == want
    assert alloc.locs("a", 1, page_size + 1) == want[1 : page_size + 1]
    assert alloc.locs("a", 3, 3) == ()


@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("first", [1, 3, 15, 16, 17])
def test_continuation_mid_page_fills_partial_page_first(page_size: int, first: int) -> None:
    alloc = make_allocator(page_size=page_size)
    alloc.allocate(RequestSpec("a", 0, first))
    before = alloc.page_table("a")
    alloc.allocate(RequestSpec("other", 0, 1))  # takes the next free page in between
    alloc.allocate(RequestSpec("a", first, page_size + 2))
    table = alloc.page_table("a")
    assert table[: len(before)] == before
    assert len(table) == -(-(first + page_size + 2) // page_size)
    assert alloc.req_to_token("a")[:first] == tuple(
        before[p // page_size] * page_size + p % page_size for p in range(first)
    )
    if first % page_size:  # the partly filled page holds the next positions
        assert alloc.locs("a", first, first + 1)[0] // page_size == before[-1]
    alloc.check_invariants()


def test_locs_rejects_positions_outside_request() -> None:
    alloc = make_allocator()
    alloc.allocate(RequestSpec("a", 0, 5))
    with pytest.raises(ValueError, match=r"outside \[0, 5\)"):
        alloc.locs("a", 2, 6)


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
        (RequestSpec("a", 10, 1, prefix_from="a"), "prefix_from must be None"),
        (RequestSpec("b", 4, 1), "no prefix_from"),
        (RequestSpec("b", 4, 1, prefix_from="zzz"), "unknown request 'zzz'"),
        (RequestSpec("b", 6, 1, prefix_from="a"), "positive multiple of page_size=4"),
        (RequestSpec("b", 0, 1, prefix_from="a"), "positive multiple of page_size=4"),
        (RequestSpec("b", 12, 1, prefix_from="a"), "exceeds the 10 tokens 'a' holds"),
        (RequestSpec("b", 0, -1), "extend_len must be >= 0"),
    ],
)
def test_rejects_inconsistent_request_and_changes_nothing(spec: RequestSpec, words: str) -> None:
    alloc = make_allocator(page_size=4)
    alloc.allocate(RequestSpec("a", 0, 10))
    before = snapshot(alloc, ["a", "b"])
    with pytest.raises(ValueError, match=words):
        alloc.allocate(spec)
    assert snapshot(alloc, ["a", "b"]) == before


def test_rejects_unknown_rid_and_bad_page() -> None:
    alloc = make_allocator(num_pages=2)
    with pytest.raises(ValueError, match="unknown request 'x'"):
        alloc.release("x")
    with pytest.raises(ValueError, match=r"page must be in \[0, 2\)"):
        alloc.refcount(2)
    with pytest.raises(ValueError, match="page_size must be >= 1"):
        PageAllocator(4, 0)


# -- pages_needed_for_trace and the property test ---------------------------------------------


def test_pages_needed_counts_shared_prefix_pages_once() -> None:
    batches = (
        BatchSpec(0, (RequestSpec("a", 0, 10),)),
        BatchSpec(1, (RequestSpec("a", 10, 3), RequestSpec("b", 8, 1, prefix_from="a"))),
    )
    # a: 13 tokens -> 4 pages; b: 2 shared + 1 own.
    assert pages_needed_for_trace(batches, page_size=4) == 5


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
    needed = pages_needed_for_trace(batches, page_size)
    alloc = PageAllocator(needed, page_size)
    ledger = TokenLedger()
    for batch in batches:
        for r in batch.requests:
            alloc.allocate(r)
            ledger.extend(r, vocab_size=1 << 30)
        alloc.check_invariants()
    assert alloc.num_pages_in_use == needed and alloc.num_free_pages == 0

    loc_of: dict[tuple[str, int], int] = {}
    for rid, writers in writers_of(batches).items():
        locs = alloc.req_to_token(rid)
        assert len(locs) == len(writers)
        assert ledger.tokens(rid) == [token_id(w, p, 1 << 30) for p, w in enumerate(writers)]
        for pos, (writer, loc) in enumerate(zip(writers, locs, strict=True)):
            assert loc_of.setdefault((writer, pos), loc) == loc  # same token, same loc
    assert len(set(loc_of.values())) == len(loc_of)  # different tokens, different locs


@settings(max_examples=50, deadline=None)
@given(traces(), st.randoms(use_true_random=False))
def test_releasing_everything_frees_every_page(
    trace: tuple[int, tuple[BatchSpec, ...]], rnd: random.Random
) -> None:
    page_size, batches = trace
    alloc = PageAllocator(pages_needed_for_trace(batches, page_size), page_size)
    rids: list[str] = []
    for batch in batches:
        for r in batch.requests:
            alloc.allocate(r)
            if r.rid not in rids:
                rids.append(r.rid)
    rnd.shuffle(rids)
    for rid in rids:
        alloc.release(rid)
        alloc.check_invariants()
    assert alloc.num_free_pages == alloc.num_pages and alloc.pages_in_use == frozenset()
