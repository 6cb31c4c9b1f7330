"""Page-aligned zigzag split (phase 4): coverage, one compute owner per page, block shapes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv_core.config import CpMode
from cpkv_core.planning.split import (
    Segment,
    SplitMetadata,
    build_round_robin_split,
    build_zigzag_split,
)
from cpkv_core.planning.split_page_aligned import (
    build_page_aligned_zigzag_split,
    compute_owner_of_pages,
    is_short_request,
    local_pair_lengths,
    page_aligned_block_sizes,
    request_pages,
)

CP_SIZES = tuple(range(1, 9))
PAGE_SIZES = (1, 4, 16)

Request = tuple[int, int]
"""``(prefix_len, extend_len)`` of one request."""


def _min_extend(prefix_len: int, cp_size: int, page_size: int) -> int:
    """Fewest current tokens that give a request ``2 * cp_size`` pages."""
    first_page = prefix_len // page_size
    return (first_page + 2 * cp_size - 1) * page_size - prefix_len + 1


@st.composite
def long_batches(draw: st.DrawFn) -> tuple[list[Request], int, int]:
    """A batch with no short request: ``(requests, cp_size, page_size)``."""
    cp_size = draw(st.integers(1, 8))
    page_size = draw(st.sampled_from(PAGE_SIZES))
    requests: list[Request] = []
    for _ in range(draw(st.integers(0, 5))):
        # NOTE: prefix lengths off the page grid come up often: they make a partial first page.
        prefix_len = draw(st.one_of(st.integers(0, 3 * page_size), st.integers(0, 500)))
        extra = draw(st.one_of(st.integers(0, page_size + 1), st.integers(0, 400)))
        requests.append((prefix_len, _min_extend(prefix_len, cp_size, page_size) + extra))
    return requests, cp_size, page_size


def _lens(requests: list[Request]) -> tuple[list[int], list[int]]:
    return [e for _, e in requests], [p for p, _ in requests]


def _build(requests: list[Request], cp_size: int, page_size: int) -> SplitMetadata:
    extend_lens, prefix_lens = _lens(requests)
    return build_page_aligned_zigzag_split(extend_lens, prefix_lens, cp_size, page_size)


def _offsets(extend_lens: list[int]) -> list[int]:
    offsets, total = [], 0
    for length in extend_lens:
        offsets.append(total)
        total += length
    return offsets


def _reference_block_of_page(page: int, pages: int, cp_size: int) -> int:
    """Block of the request's ``page``-th current page, from the page deal written out."""
    base, rem = divmod(pages, 2 * cp_size)
    if page < rem * (base + 1):
        return page // (base + 1)
    return rem + (page - rem * (base + 1)) // base


def _reference_rank_of_block(block: int, cp_size: int) -> int:
    return block if block < cp_size else 2 * cp_size - 1 - block


def _grid_requests(cp_size: int, page_size: int) -> list[Request]:
    """Prefixes on and off the page grid, extends at the short limit and page boundary +-1."""
    requests: list[Request] = []
    for prefix_len in sorted({0, 1, page_size - 1, page_size, page_size + 1, 3 * page_size + 2}):
        low = _min_extend(prefix_len, cp_size, page_size)
        for extend_len in (low, low + 1, low + page_size - 1, low + page_size, 5 * low + 3):
            requests.append((prefix_len, extend_len))
    return requests


def _assert_split_consistent(split: SplitMetadata, extend_lens: list[int]) -> None:
    num_tokens = sum(extend_lens)
    assert sorted(g for local in split.local_token_indices for g in local) == list(
        range(num_tokens)
    )
    offsets = _offsets(extend_lens)
    for rank in range(split.cp_size):
        local = split.local_token_indices[rank]
        assert list(local) == sorted(local)
        from_segments = tuple(
            offsets[seg.request_index] + j
            for seg in split.segments[rank]
            for j in range(seg.start, seg.end)
        )
        assert from_segments == local
    index = split.gather_index()
    assert len(set(index)) == num_tokens


def _assert_one_owner_per_page(split: SplitMetadata, requests: list[Request], ps: int) -> None:
    owner = split.owner_of_token()
    offset = 0
    for prefix_len, extend_len in requests:
        ranks_of_page: dict[int, set[int]] = {}
        for i in range(extend_len):
            page = (prefix_len + i) // ps
            ranks_of_page.setdefault(page, set()).add(owner[offset + i])
        assert all(len(ranks) == 1 for ranks in ranks_of_page.values()), ranks_of_page
        assert len(ranks_of_page) == request_pages(prefix_len, extend_len, ps)
        offset += extend_len


@settings(max_examples=300, deadline=None)
@given(
    prefix_len=st.integers(0, 300), extend_len=st.integers(0, 300), ps=st.sampled_from((1, 4, 16))
)
def test_request_pages_counts_distinct_logical_pages(
    prefix_len: int, extend_len: int, ps: int
) -> None:
    pages = {pos // ps for pos in range(prefix_len, prefix_len + extend_len)}
    assert request_pages(prefix_len, extend_len, ps) == len(pages)


@pytest.mark.parametrize(
    ("prefix_len", "extend_len", "page_size", "pages"),
    [
        (0, 0, 4, 0),
        (5, 0, 4, 0),
        (0, 1, 16, 1),
        (0, 16, 16, 1),
        (0, 17, 16, 2),
        (6, 2, 4, 1),
        (6, 3, 4, 2),
        (6, 31, 4, 9),
    ],
)
def test_request_pages_counts_partial_first_and_last_pages(
    prefix_len: int, extend_len: int, page_size: int, pages: int
) -> None:
    assert request_pages(prefix_len, extend_len, page_size) == pages


@settings(max_examples=300, deadline=None)
@given(batch=long_batches())
def test_page_aligned_split_covers_every_token_exactly_once(
    batch: tuple[list[Request], int, int],
) -> None:
    requests, cp_size, page_size = batch
    split = _build(requests, cp_size, page_size)
    assert split.mode == CpMode.IN_SEQ_SPLIT
    assert split.page_aligned
    assert split.cp_size == cp_size
    _assert_split_consistent(split, _lens(requests)[0])


@settings(max_examples=300, deadline=None)
@given(batch=long_batches())
def test_every_current_page_has_exactly_one_compute_owner(
    batch: tuple[list[Request], int, int],
) -> None:
    requests, cp_size, page_size = batch
    _assert_one_owner_per_page(_build(requests, cp_size, page_size), requests, page_size)


@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("cp_size", CP_SIZES)
def test_grid_with_mid_page_prefix_and_partial_last_page_has_one_owner_per_page(
    cp_size: int, page_size: int
) -> None:
    requests = _grid_requests(cp_size, page_size)
    split = _build(requests, cp_size, page_size)
    _assert_split_consistent(split, _lens(requests)[0])
    _assert_one_owner_per_page(split, requests, page_size)


@settings(max_examples=300, deadline=None)
@given(batch=long_batches())
def test_block_sizes_are_whole_pages_except_first_and_last(
    batch: tuple[list[Request], int, int],
) -> None:
    requests, cp_size, ps = batch
    for prefix_len, extend_len in requests:
        sizes = page_aligned_block_sizes(prefix_len, extend_len, cp_size, ps)
        assert len(sizes) == 2 * cp_size and sum(sizes) == extend_len
        assert all(size > 0 for size in sizes)
        # Block 0: whole pages less the cached head of its first page; the last block: whole
        # pages less the unfilled tail of its last page; every block between: whole pages.
        assert (prefix_len % ps + sizes[0]) % ps == 0
        assert all(size % ps == 0 for size in sizes[1:-1])
        assert (sizes[-1] + -(prefix_len + extend_len) % ps) % ps == 0


@settings(max_examples=300, deadline=None)
@given(batch=long_batches())
def test_page_counts_per_block_differ_by_at_most_one(
    batch: tuple[list[Request], int, int],
) -> None:
    requests, cp_size, ps = batch
    for prefix_len, extend_len in requests:
        sizes = page_aligned_block_sizes(prefix_len, extend_len, cp_size, ps)
        start, page_counts = prefix_len, []
        for size in sizes:
            page_counts.append(len({pos // ps for pos in range(start, start + size)}))
            start += size
        assert sum(page_counts) == request_pages(prefix_len, extend_len, ps)
        assert max(page_counts) - min(page_counts) <= 1
        assert page_counts == sorted(page_counts, reverse=True)


@settings(max_examples=300, deadline=None)
@given(batch=long_batches())
def test_rank_holds_exactly_blocks_r_and_mirror(batch: tuple[list[Request], int, int]) -> None:
    requests, cp_size, ps = batch
    split = _build(requests, cp_size, ps)
    for rank in range(cp_size):
        expected: list[Segment] = []
        for request_index, (prefix_len, extend_len) in enumerate(requests):
            sizes = page_aligned_block_sizes(prefix_len, extend_len, cp_size, ps)
            for block in (rank, 2 * cp_size - 1 - rank):
                expected.append(Segment(request_index, sum(sizes[:block]), sizes[block]))
        assert list(split.segments[rank]) == expected


@settings(max_examples=300, deadline=None)
@given(batch=long_batches())
def test_compute_owner_of_pages_agrees_with_owner_of_token(
    batch: tuple[list[Request], int, int],
) -> None:
    requests, cp_size, ps = batch
    extend_lens, prefix_lens = _lens(requests)
    owners = compute_owner_of_pages(extend_lens, prefix_lens, cp_size, ps)
    owner_of_token = _build(requests, cp_size, ps).owner_of_token()
    offset = 0
    for (prefix_len, extend_len), page_owners in zip(requests, owners, strict=True):
        pages = request_pages(prefix_len, extend_len, ps)
        assert len(page_owners) == pages
        first_page = prefix_len // ps
        for i in range(extend_len):
            page = (prefix_len + i) // ps - first_page
            assert page_owners[page] == owner_of_token[offset + i]
            block = _reference_block_of_page(page, pages, cp_size)
            assert page_owners[page] == _reference_rank_of_block(block, cp_size)
        offset += extend_len


@settings(max_examples=300, deadline=None)
@given(batch=long_batches())
def test_local_pair_lengths_add_up_to_rank_tokens_of_request(
    batch: tuple[list[Request], int, int],
) -> None:
    requests, cp_size, ps = batch
    split = _build(requests, cp_size, ps)
    offsets = _offsets(_lens(requests)[0])
    for rank in range(cp_size):
        local = set(split.local_token_indices[rank])
        for request_index, (prefix_len, extend_len) in enumerate(requests):
            first, second = local_pair_lengths(split, rank, request_index)
            start = offsets[request_index]
            assert first + second == len(local & set(range(start, start + extend_len)))
            sizes = page_aligned_block_sizes(prefix_len, extend_len, cp_size, ps)
            assert (first, second) == (sizes[rank], sizes[2 * cp_size - 1 - rank])


def test_page_aligned_example_cp2_mid_page_prefix() -> None:
    # Positions 6..36 over pages of 4: pages 1..9 (page 1 holds 6, 7; page 9 holds 36).
    # 9 pages over 4 blocks: [3, 2, 2, 2] pages -> [10, 8, 8, 5] tokens.
    assert page_aligned_block_sizes(6, 31, 2, 4) == (10, 8, 8, 5)
    split = build_page_aligned_zigzag_split([31], [6], 2, 4)
    assert split.segments == (
        (Segment(0, 0, 10), Segment(0, 26, 5)),
        (Segment(0, 10, 8), Segment(0, 18, 8)),
    )
    assert compute_owner_of_pages([31], [6], 2, 4) == ((0, 0, 0, 1, 1, 1, 1, 0, 0),)
    assert local_pair_lengths(split, 0, 0) == (10, 5)
    assert local_pair_lengths(split, 1, 0) == (8, 8)


@pytest.mark.parametrize("cp_size", CP_SIZES)
def test_local_pair_lengths_are_unequal_when_pages_are_partial(cp_size: int) -> None:
    split = build_page_aligned_zigzag_split([8 * cp_size * 4 + 1], [3], cp_size, 4)
    first, second = local_pair_lengths(split, 0, 0)
    assert first != second


def test_local_pair_lengths_are_zero_for_a_request_the_rank_does_not_hold() -> None:
    split = build_page_aligned_zigzag_split([0, 40], [0, 0], 2, 4)
    assert local_pair_lengths(split, 1, 0) == (0, 0)
    assert local_pair_lengths(split, 1, 7) == (0, 0)


def test_local_pair_lengths_handle_token_balanced_zigzag_with_empty_blocks() -> None:
    # Blocks of 3 over 4: [1, 1, 1, 0] -> rank 0 holds block 0 only, rank 1 blocks 1 and 2.
    split = build_zigzag_split([3], 2)
    assert local_pair_lengths(split, 0, 0) == (1, 0)
    assert local_pair_lengths(split, 1, 0) == (1, 1)


def test_local_pair_lengths_reject_round_robin_split() -> None:
    with pytest.raises(ValueError, match="zigzag"):
        local_pair_lengths(build_round_robin_split([8], 2), 0, 0)


def test_local_pair_lengths_reject_rank_out_of_range() -> None:
    with pytest.raises(ValueError, match=r"rank must be in \[0, 2\), got 2"):
        local_pair_lengths(build_zigzag_split([8], 2), 2, 0)


@pytest.mark.parametrize("cp_size", CP_SIZES)
def test_page_size_one_equals_token_balanced_zigzag(cp_size: int) -> None:
    extend_lens = [2 * cp_size, 2 * cp_size + 1, 7 * cp_size + 3]
    split = build_page_aligned_zigzag_split(extend_lens, [0, 5, 2], cp_size, 1)
    balanced = build_zigzag_split(extend_lens, cp_size)
    assert split.segments == balanced.segments
    assert split.local_token_indices == balanced.local_token_indices


@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("cp_size", CP_SIZES)
def test_detects_short_request_at_the_page_limit(cp_size: int, page_size: int) -> None:
    for prefix_len in (0, 1, page_size - 1, page_size + 1):
        low = _min_extend(prefix_len, cp_size, page_size)
        assert request_pages(prefix_len, low, page_size) == 2 * cp_size
        assert not is_short_request(prefix_len, low, cp_size, page_size)
        assert is_short_request(prefix_len, low - 1, cp_size, page_size) == (low > 1)


def test_empty_request_is_not_short_and_gets_no_segments() -> None:
    assert not is_short_request(5, 0, 4, 16)
    assert page_aligned_block_sizes(5, 0, 2, 4) == (0, 0, 0, 0)
    split = build_page_aligned_zigzag_split([0, 16], [3, 0], 2, 4)
    assert all(seg.request_index == 1 for segs in split.segments for seg in segs)
    assert compute_owner_of_pages([0, 16], [3, 0], 2, 4) == ((), (0, 1, 1, 0))


def test_builder_rejects_batch_with_a_short_request() -> None:
    # Request 1: positions 6..13 over pages of 4 span 3 pages < 2*cp_size = 4.
    with pytest.raises(ValueError, match=r"pages=3 for request 1.*token-balanced"):
        build_page_aligned_zigzag_split([40, 8], [0, 6], 2, 4)


def test_compute_owner_of_pages_rejects_short_request() -> None:
    with pytest.raises(ValueError, match=r"2\*cp_size=4 pages.*pages=1"):
        compute_owner_of_pages([4], [0], 2, 4)


def test_block_sizes_reject_short_request() -> None:
    with pytest.raises(ValueError, match="short"):
        page_aligned_block_sizes(0, 3, 2, 1)


def test_rejects_mismatched_length_lists() -> None:
    with pytest.raises(ValueError, match="got 2 and 1"):
        build_page_aligned_zigzag_split([8, 8], [0], 1, 4)


@pytest.mark.parametrize(
    ("prefix_len", "extend_len", "page_size", "match"),
    [(0, 8, 0, "page_size must be >= 1"), (-1, 8, 4, "prefix_len"), (0, -2, 4, "extend_len")],
)
def test_rejects_bad_lengths(prefix_len: int, extend_len: int, page_size: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        request_pages(prefix_len, extend_len, page_size)


def test_rejects_cp_size_below_one() -> None:
    with pytest.raises(ValueError, match=r"cp_size must be >= 1.*got 0"):
        build_page_aligned_zigzag_split([8], [0], 0, 4)


def test_empty_batch_gives_empty_page_aligned_split() -> None:
    split = build_page_aligned_zigzag_split([], [], 3, 16)
    assert split.local_token_indices == ((), (), ())
    assert split.page_aligned
