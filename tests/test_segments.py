"""Splits as numpy segments equal the token-by-token oracle splits, for every strategy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv_core.planning import (
    BatchSpec,
    OwnerPolicy,
    RequestSpec,
    Scheduler,
    SplitStrategy,
    pages_for_trace,
)
from cpkv_core.planning.page_runs import current_page_runs, flatten_tables
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
from cpkv_core.planning.split_page_interleaved import build_page_interleaved_split


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


@settings(max_examples=150, deadline=None)
@given(
    chunks=st.lists(st.tuples(st.integers(1, 40), st.integers(1, 40)), min_size=1, max_size=3),
    cp_size=st.integers(1, 5),
    page_size=st.sampled_from([1, 2, 4, 8]),
    policy=st.sampled_from(list(OwnerPolicy)),
)
def test_page_interleaved_segments_equal_the_oracle(
    chunks: list[tuple[int, int]], cp_size: int, page_size: int, policy: OwnerPolicy
) -> None:
    """Two requests chunked alike: every chunk after the first resumes where the last
    stopped, mid-page when the lengths are off the page grid."""
    held = {"a": 0, "b": 0}
    batches = []
    for index, lengths in enumerate(chunks):
        pairs = list(zip("ab", lengths, strict=True))
        batches.append(BatchSpec(index, tuple(RequestSpec(r, held[r], n) for r, n in pairs)))
        held = {r: held[r] + n for r, n in pairs}
    scheduler = Scheduler(pages_for_trace(batches, page_size, cp_size), page_size, cp_size)
    for batch in batches:
        s = scheduler.schedule(batch, policy)
        tables = [r.page_table for r in s.requests]
        flat, table_cu = flatten_tables(tables)
        runs = current_page_runs(s.extend_lens, s.prefix_lens, flat, table_cu, page_size)
        segs = build_segments(
            SplitStrategy.PAGE_INTERLEAVED, s.extend_lens, s.prefix_lens, cp_size, page_size, runs
        )
        oracle = build_page_interleaved_split(
            s.extend_lens, s.prefix_lens, tables, cp_size, page_size
        )
        assert_same_split(segs, oracle)
        assert segs.page_aligned


def test_page_interleaved_segments_need_the_page_runs() -> None:
    with pytest.raises(ValueError, match="pass page_runs"):
        build_segments(SplitStrategy.PAGE_INTERLEAVED, [4], [0], 2, 4)
