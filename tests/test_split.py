"""CP split metadata: coverage, block sizes, gather index, zigzag and round-robin owners."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv_core.config import CpMode
from cpkv_core.planning.split import (
    Segment,
    SplitMetadata,
    build_round_robin_split,
    build_split,
    build_zigzag_split,
    zigzag_block_sizes,
)

CP_SIZES = (1, 2, 3, 4)
MODES = (CpMode.IN_SEQ_SPLIT, CpMode.ROUND_ROBIN_SPLIT)

cp_sizes = st.integers(min_value=1, max_value=8)
# NOTE: short lengths are weighted in so that requests shorter than 2*cp_size (empty blocks)
# and empty requests come up often.
lengths = st.one_of(st.integers(0, 17), st.integers(0, 300))
batches = st.lists(lengths, min_size=0, max_size=6)


def _request_offsets(extend_lens: list[int]) -> list[int]:
    offsets, total = [], 0
    for length in extend_lens:
        offsets.append(total)
        total += length
    return offsets


def _length_cases(cp_size: int) -> list[list[int]]:
    s = 2 * cp_size
    return [[0], [1], [s - 1], [s], [s + 1], [0, 1, s - 1, s + 1, 3 * s + 2, 0, 37]]


def _assert_consistent(split: SplitMetadata, extend_lens: list[int]) -> None:
    """Covers every token once, ascending per rank, segments match local indices."""
    num_tokens = sum(extend_lens)
    all_tokens = sorted(g for local in split.local_token_indices for g in local)
    assert all_tokens == list(range(num_tokens))
    assert split.num_tokens == num_tokens
    offsets = _request_offsets(extend_lens)
    for rank in range(split.cp_size):
        local = split.local_token_indices[rank]
        assert list(local) == sorted(local)
        assert split.num_local(rank) == len(local)
        from_segments = [
            offsets[seg.request_index] + j
            for seg in split.segments[rank]
            for j in range(seg.start, seg.end)
        ]
        assert tuple(from_segments) == local
        for seg in split.segments[rank]:
            assert seg.length > 0
            assert seg.start >= 0 and seg.end <= extend_lens[seg.request_index]


def _assert_gather_index_valid(split: SplitMetadata) -> None:
    """gather_index is injective into the padded stack and inverts the local layout."""
    index = split.gather_index()
    assert len(index) == split.num_tokens
    assert len(set(index)) == len(index)
    assert all(0 <= row < split.cp_size * split.max_local for row in index)
    owner = split.owner_of_token()
    for rank, local in enumerate(split.local_token_indices):
        for i, g in enumerate(local):
            assert index[g] == rank * split.max_local + i
            assert owner[g] == rank


@settings(max_examples=200, deadline=None)
@given(length=st.integers(0, 1000), cp_size=cp_sizes)
def test_block_sizes_sum_to_length_and_differ_by_at_most_one(length: int, cp_size: int) -> None:
    sizes = zigzag_block_sizes(length, cp_size)
    assert len(sizes) == 2 * cp_size
    assert sum(sizes) == length
    assert max(sizes) - min(sizes) <= 1
    assert list(sizes) == sorted(sizes, reverse=True)


@settings(max_examples=200, deadline=None)
@given(extend_lens=batches, cp_size=cp_sizes, mode=st.sampled_from(MODES))
def test_split_covers_every_token_exactly_once(
    extend_lens: list[int], cp_size: int, mode: CpMode
) -> None:
    split = build_split(extend_lens, cp_size, mode)
    assert split.mode == mode
    assert split.cp_size == cp_size
    assert not split.page_aligned
    _assert_consistent(split, extend_lens)


@settings(max_examples=200, deadline=None)
@given(extend_lens=batches, cp_size=cp_sizes, mode=st.sampled_from(MODES))
def test_gather_index_is_injective_and_inverts_local_rows(
    extend_lens: list[int], cp_size: int, mode: CpMode
) -> None:
    split = build_split(extend_lens, cp_size, mode)
    _assert_gather_index_valid(split)
    assert split.max_local == max(split.num_local(r) for r in range(cp_size))


@settings(max_examples=200, deadline=None)
@given(extend_lens=batches, cp_size=cp_sizes)
def test_zigzag_rank_holds_exactly_its_two_blocks(extend_lens: list[int], cp_size: int) -> None:
    split = build_zigzag_split(extend_lens, cp_size)
    for rank in range(cp_size):
        expected: list[Segment] = []
        for request_index, length in enumerate(extend_lens):
            sizes = zigzag_block_sizes(length, cp_size)
            for block in (rank, 2 * cp_size - 1 - rank):
                if sizes[block] > 0:
                    expected.append(Segment(request_index, sum(sizes[:block]), sizes[block]))
        assert list(split.segments[rank]) == expected


@settings(max_examples=200, deadline=None)
@given(extend_lens=batches, cp_size=cp_sizes)
def test_round_robin_rank_is_token_index_mod_cp_size(extend_lens: list[int], cp_size: int) -> None:
    split = build_round_robin_split(extend_lens, cp_size)
    assert split.owner_of_token() == tuple(g % cp_size for g in range(sum(extend_lens)))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("cp_size", CP_SIZES)
@pytest.mark.parametrize("case", range(6))
def test_split_grid_covers_tokens(cp_size: int, mode: CpMode, case: int) -> None:
    extend_lens = _length_cases(cp_size)[case]
    split = build_split(extend_lens, cp_size, mode)
    _assert_consistent(split, extend_lens)
    _assert_gather_index_valid(split)


@pytest.mark.parametrize("cp_size", CP_SIZES)
def test_zigzag_balances_tokens_within_two(cp_size: int) -> None:
    split = build_zigzag_split([8 * cp_size + 3, 2 * cp_size - 1], cp_size)
    counts = [split.num_local(r) for r in range(cp_size)]
    assert max(counts) - min(counts) <= 2


def test_zigzag_example_cp2_length_10() -> None:
    # Blocks of 10 over 4: [3, 3, 2, 2] -> rank 0 takes blocks 0 and 3, rank 1 blocks 1 and 2.
    split = build_zigzag_split([10], 2)
    assert split.local_token_indices == ((0, 1, 2, 8, 9), (3, 4, 5, 6, 7))
    assert split.segments == (
        (Segment(0, 0, 3), Segment(0, 8, 2)),
        (Segment(0, 3, 3), Segment(0, 6, 2)),
    )
    assert split.gather_index() == (0, 1, 2, 5, 6, 7, 8, 9, 3, 4)


def test_round_robin_example_crosses_requests() -> None:
    split = build_round_robin_split([3, 2], 2)
    assert split.local_token_indices == ((0, 2, 4), (1, 3))
    assert split.segments == (
        (Segment(0, 0, 1), Segment(0, 2, 1), Segment(1, 1, 1)),
        (Segment(0, 1, 1), Segment(1, 0, 1)),
    )


def test_round_robin_cp1_keeps_whole_requests_as_one_segment() -> None:
    split = build_round_robin_split([4, 0, 2], 1)
    assert split.segments == ((Segment(0, 0, 4), Segment(2, 0, 2)),)


@pytest.mark.parametrize("mode", MODES)
def test_empty_batch_gives_empty_split(mode: CpMode) -> None:
    split = build_split([], 3, mode)
    assert split.num_tokens == 0
    assert split.max_local == 0
    assert split.gather_index() == ()
    assert split.local_token_indices == ((), (), ())


@pytest.mark.parametrize("mode", MODES)
def test_rejects_cp_size_below_one(mode: CpMode) -> None:
    with pytest.raises(ValueError, match=r"cp_size must be >= 1.*got 0"):
        build_split([4], 0, mode)


@pytest.mark.parametrize("mode", MODES)
def test_rejects_negative_extend_len(mode: CpMode) -> None:
    with pytest.raises(ValueError, match=r"extend_lens must all be >= 0, got -1 for request 1"):
        build_split([4, -1], 2, mode)


def test_block_sizes_reject_negative_length() -> None:
    with pytest.raises(ValueError, match="got -5"):
        zigzag_block_sizes(-5, 2)


def test_metadata_rejects_wrong_number_of_ranks() -> None:
    with pytest.raises(ValueError, match="one entry per rank"):
        SplitMetadata(
            cp_size=2, mode=CpMode.IN_SEQ_SPLIT, local_token_indices=((),), segments=((),)
        )
