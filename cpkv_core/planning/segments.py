"""Splits as segments, in numpy: which rank computes which run of a batch's current tokens.

``split`` and ``split_page_aligned`` state the splits token by token in plain Python (the
oracle the tests hold these to). Here the same splits are built per segment with vectorised
integer ops, O(requests * cp_size) whatever the token counts, so a host plan never loops
over tokens. A segment is ``count`` batch tokens ``g0, g0 + stride, ...`` computed by one
rank: zigzag blocks have stride 1, a rank's round-robin tokens one segment of stride
``cp_size``, the page-interleaved split one segment per current page (the page runs of
``page_runs``, dealt to each page's owner). The ``none`` split (CP off for the batch) gives
every rank one segment of every token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from cpkv_core.planning.execution import SplitStrategy
from cpkv_core.planning.ownership import owner_of_page
from cpkv_core.planning.page_runs import PageRuns

__all__ = ["SplitSegments", "build_segments", "zigzag_rank_of_block"]

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class SplitSegments:
    """Every rank's segments, rank-major; within a rank in ascending token order.

    Invariant: the segments cover every batch token exactly once, or, when ``replicated``
    (the ``none`` split), every rank holds one segment covering every token; ``row0`` is the
    rank's local row of a segment's first token, so a rank's local rows ascend with its
    tokens.
    """

    cp_size: int
    num_tokens: int
    rank: IntArray
    g0: IntArray
    count: IntArray
    stride: IntArray
    row0: IntArray
    page_aligned: bool
    replicated: bool = False
    """Every rank computes every token (the ``none`` split): local row ``g`` is token ``g``."""

    @property
    def num_local(self) -> IntArray:
        """Tokens each rank computes, ``[cp_size]``."""
        return np.bincount(self.rank, weights=self.count, minlength=self.cp_size).astype(np.int64)

    def rank_of_tokens(self, tokens: IntArray) -> tuple[IntArray, IntArray]:
        """``(rank, local row)`` of each batch token in ``tokens``.

        Raises:
            RuntimeError: the split is replicated: every rank computes every token.
        """
        if self.replicated:
            raise RuntimeError(
                "the none split computes every token on every rank: no token has one rank, "
                "indicates a bug in the caller"
            )
        if not len(tokens):
            return tokens.copy(), tokens.copy()
        if int(self.stride.max(initial=1)) > 1:
            # NOTE: round-robin: one strided segment per rank.
            return tokens % self.cp_size, tokens // self.cp_size
        nonempty = np.flatnonzero(self.count > 0)
        order = nonempty[np.argsort(self.g0[nonempty], kind="stable")]
        seg = order[np.searchsorted(self.g0[order], tokens, side="right") - 1]
        return self.rank[seg], self.row0[seg] + tokens - self.g0[seg]


def zigzag_rank_of_block(cp_size: int) -> IntArray:
    """Rank of each of the ``2 * cp_size`` zigzag blocks: ``k`` or ``2 * cp_size - 1 - k``."""
    blocks = np.arange(2 * cp_size, dtype=np.int64)
    return np.where(blocks < cp_size, blocks, 2 * cp_size - 1 - blocks)


def _zigzag_bounds(
    extend: IntArray, prefix: IntArray, cp_size: int, page_size: int | None
) -> IntArray:
    """``[bs, 2 * cp_size + 1]`` block boundaries in tokens from each request's first
    current token; cut at logical page boundaries when ``page_size`` is given."""
    num_blocks = 2 * cp_size
    k = np.arange(num_blocks, dtype=np.int64)[None, :]
    units = extend if page_size is None else _current_pages(extend, prefix, page_size)
    base, rem = np.divmod(units, num_blocks)
    sizes = base[:, None] + (k < rem[:, None])
    bounds = np.concatenate([np.zeros((len(units), 1), np.int64), np.cumsum(sizes, axis=1)], 1)
    if page_size is None:
        return bounds
    first_page = (prefix // page_size)[:, None]
    positions = (first_page + bounds) * page_size
    end = (prefix + extend)[:, None]
    clipped: IntArray = np.clip(positions, prefix[:, None], end)
    return clipped - prefix[:, None]


def _current_pages(extend: IntArray, prefix: IntArray, page_size: int) -> IntArray:
    pages = -(-(prefix + extend) // page_size) - prefix // page_size
    return np.where(extend > 0, pages, 0)


def _zigzag(
    extend: IntArray, prefix: IntArray, cp_size: int, page_size: int | None
) -> SplitSegments:
    bs, num_blocks = len(extend), 2 * cp_size
    bounds = _zigzag_bounds(extend, prefix, cp_size, page_size)
    starts = np.concatenate([[0], np.cumsum(extend)[:-1]]).astype(np.int64)
    rank_of_block = zigzag_rank_of_block(cp_size)
    # NOTE: per rank, request by request, block r then block 2*cp_size-1-r: ascending g.
    ranks = np.repeat(np.arange(cp_size, dtype=np.int64), bs * 2)
    requests = np.tile(np.repeat(np.arange(bs, dtype=np.int64), 2), cp_size)
    blocks = np.stack([np.arange(cp_size), num_blocks - 1 - np.arange(cp_size)], 1)
    blocks = np.repeat(blocks, bs, axis=0).reshape(-1)
    g0 = starts[requests] + bounds[requests, blocks]
    count = bounds[requests, blocks + 1] - bounds[requests, blocks]
    assert np.array_equal(rank_of_block[blocks], ranks), "zigzag block order"
    return _with_rows(cp_size, int(extend.sum()), ranks, g0, count, np.ones_like(g0), page_size)


def _with_rows(
    cp_size: int,
    num_tokens: int,
    ranks: IntArray,
    g0: IntArray,
    count: IntArray,
    stride: IntArray,
    page_size: int | None,
) -> SplitSegments:
    before = np.cumsum(count) - count
    rank_start = np.concatenate([[0], np.cumsum(np.bincount(ranks, count, cp_size))[:-1]])
    row0 = before - rank_start[ranks].astype(np.int64)
    return SplitSegments(
        cp_size, num_tokens, ranks, g0, count, stride, row0.astype(np.int64), page_size is not None
    )


def _round_robin(num_tokens: int, cp_size: int) -> SplitSegments:
    ranks = np.arange(cp_size, dtype=np.int64)
    count = np.maximum(0, -(-(num_tokens - ranks) // cp_size))
    stride = np.full(cp_size, cp_size, np.int64)
    return _with_rows(cp_size, num_tokens, ranks, ranks.copy(), count, stride, None)


def _page_interleaved(runs: PageRuns, cp_size: int, num_tokens: int) -> SplitSegments:
    """Each page run to its page's owner: compute owner = storage owner by construction."""
    ranks = owner_of_page(runs.page, cp_size)
    # NOTE: the runs ascend in g; a stable sort by rank keeps them ascending per rank.
    order = np.argsort(ranks, kind="stable")
    g0, count = runs.g0[order], runs.count[order]
    return _with_rows(cp_size, num_tokens, ranks[order], g0, count, np.ones_like(g0), 1)


def _unsplit(num_tokens: int, cp_size: int) -> SplitSegments:
    ranks = np.arange(cp_size, dtype=np.int64)
    zeros = np.zeros(cp_size, np.int64)
    count = np.full(cp_size, num_tokens, np.int64)
    return SplitSegments(
        cp_size, num_tokens, ranks, zeros, count, np.ones_like(zeros), zeros.copy(), False, True
    )


def build_segments(
    strategy: SplitStrategy,
    extend_lens: Sequence[int],
    prefix_lens: Sequence[int],
    cp_size: int,
    page_size: int,
    page_runs: PageRuns | None = None,
) -> SplitSegments:
    """The split of a batch under ``strategy``, as segments.

    The page-aligned zigzag assumes no request is short (the gate's SHORT_REQUEST rule).
    The page-interleaved split deals ``page_runs`` (the batch's ``current_page_runs``), so it
    needs them; every other split ignores them.
    """
    extend = np.asarray(extend_lens, dtype=np.int64)
    prefix = np.asarray(prefix_lens, dtype=np.int64)
    if strategy is SplitStrategy.PAGE_INTERLEAVED:
        if page_runs is None:
            raise ValueError(
                "the page-interleaved split deals the batch's page runs: pass page_runs "
                "(current_page_runs of the scheduled batch's page tables)"
            )
        return _page_interleaved(page_runs, cp_size, int(extend.sum()))
    if strategy is SplitStrategy.ROUND_ROBIN:
        return _round_robin(int(extend.sum()), cp_size)
    if strategy is SplitStrategy.NONE:
        return _unsplit(int(extend.sum()), cp_size)
    aligned = strategy is SplitStrategy.PAGE_ALIGNED_ZIGZAG
    return _zigzag(extend, prefix, cp_size, page_size if aligned else None)
