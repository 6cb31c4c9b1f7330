"""Splits as numpy segments equal the token-by-token oracle splits, for every strategy."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv_core.planning import SplitStrategy
from cpkv_core.planning.segments import SplitSegments, build_segments
from cpkv_core.planning.split import (
    SplitMetadata,
    build_round_robin_split,
    build_zigzag_split,
)
from cpkv_core.planning.split_page_aligned import (
    build_page_aligned_zigzag_split,
    is_short_request,
)


def tokens_of_rank(segs: SplitSegments, rank: int) -> list[int]:
    """The batch tokens of ``rank``, in local-row order, expanded on the host."""
    rows: dict[int, int] = {}
    for r, g0, count, stride, row0 in zip(
        segs.rank, segs.g0, segs.count, segs.stride, segs.row0, strict=True
    ):
        if r == rank:
            for i in range(int(count)):
                rows[int(row0) + i] = int(g0 + stride * i)
    return [rows[i] for i in range(len(rows))]


def assert_same_split(segs: SplitSegments, oracle: SplitMetadata) -> None:
    assert segs.num_tokens == oracle.num_tokens
    assert segs.num_local.tolist() == [oracle.num_local(r) for r in range(oracle.cp_size)]
    for rank in range(oracle.cp_size):
        assert tokens_of_rank(segs, rank) == list(oracle.local_token_indices[rank])
    every = np.arange(oracle.num_tokens, dtype=np.int64)
    ranks, rows = segs.rank_of_tokens(every)
    assert ranks.tolist() == list(oracle.owner_of_token())
    for g, (rank, row) in enumerate(zip(ranks.tolist(), rows.tolist(), strict=True)):
        assert oracle.local_token_indices[rank][row] == g


lengths = st.lists(st.integers(1, 70), min_size=1, max_size=6)


@settings(max_examples=150, deadline=None)
@given(extend=lengths, cp_size=st.integers(1, 5))
def test_zigzag_segments_equal_the_oracle(extend: list[int], cp_size: int) -> None:
    segs = build_segments(SplitStrategy.ZIGZAG, extend, [0] * len(extend), cp_size, 4)
    assert_same_split(segs, build_zigzag_split(extend, cp_size))


@settings(max_examples=150, deadline=None)
@given(extend=lengths, cp_size=st.integers(1, 5))
def test_round_robin_segments_equal_the_oracle(extend: list[int], cp_size: int) -> None:
    segs = build_segments(SplitStrategy.ROUND_ROBIN, extend, [0] * len(extend), cp_size, 4)
    assert_same_split(segs, build_round_robin_split(extend, cp_size))


@settings(max_examples=150, deadline=None)
@given(
    requests=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 50)), min_size=1, max_size=5),
    cp_size=st.integers(1, 4),
    page_size=st.sampled_from([1, 2, 4, 8]),
)
def test_page_aligned_segments_equal_the_oracle(
    requests: list[tuple[int, int]], cp_size: int, page_size: int
) -> None:
    # NOTE: 2*cp_size*page_size current tokens span >= 2*cp_size pages: never short.
    prefix = [p for p, _ in requests]
    extend = [2 * cp_size * page_size + e for _, e in requests]
    assert not any(
        is_short_request(p, e, cp_size, page_size) for p, e in zip(prefix, extend, strict=True)
    )
    segs = build_segments(SplitStrategy.PAGE_ALIGNED_ZIGZAG, extend, prefix, cp_size, page_size)
    oracle = build_page_aligned_zigzag_split(extend, prefix, cp_size, page_size)
    assert_same_split(segs, oracle)
    assert segs.page_aligned
