"""Per-rank load of a split, in integers: current tokens and causal attention work.

A query at logical position ``pos`` attends the ``pos + 1`` keys at positions ``0..pos`` (the
indexer scores every one of them before its top-k), so a rank's causal attention work is the
sum of ``pos + 1`` over the tokens it computes; a run of ``n`` tokens from position ``p0``
with stride ``s`` costs ``n * (p0 + 1) + s * n * (n - 1) / 2``. Loads are computed from a
split's segments with closed forms, O(segments + requests), never per token.

The batch's step takes as long as its busiest rank, so ``max / mean`` over ranks is what a
split costs against a perfect balance. The page-interleaved split (phase 4 under
``round-robin-split``) is taken only while that stays within a bound
(:func:`page_interleave_fits`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from cpkv_core.planning.execution import SplitStrategy
from cpkv_core.planning.ownership import owner_of_page
from cpkv_core.planning.page_runs import current_page_runs, flatten_tables
from cpkv_core.planning.segments import SplitSegments, build_segments

__all__ = [
    "PAGE_INTERLEAVE_MAX_IMBALANCE",
    "RankLoad",
    "owner_load",
    "page_interleave_fits",
    "rank_load",
    "split_load",
]

IntArray = npt.NDArray[np.int64]


def _max_over_mean(values: tuple[int, ...]) -> float:
    total = sum(values)
    return max(values) * len(values) / total if total else 1.0


@dataclass(frozen=True, slots=True)
class RankLoad:
    """What each rank computes for one batch under one split."""

    tokens: tuple[int, ...]
    """``[cp_size]`` current tokens per rank."""
    work: tuple[int, ...]
    """``[cp_size]`` causal attention work per rank: queries x keys they attend."""

    @property
    def tokens_max_over_mean(self) -> float:
        """Busiest rank's tokens over the mean (1.0 is a perfect balance)."""
        return _max_over_mean(self.tokens)

    @property
    def work_max_over_mean(self) -> float:
        """Busiest rank's causal work over the mean (1.0 is a perfect balance)."""
        return _max_over_mean(self.work)

    @property
    def idle_ranks(self) -> int:
        """Ranks that compute no token."""
        return sum(1 for n in self.tokens if n == 0)


def _progression_work(p0: IntArray, n: IntArray, stride: IntArray) -> IntArray:
    """Sum of ``pos + 1`` over ``n`` positions from ``p0`` with step ``stride``."""
    work: IntArray = n * (p0 + 1) + stride * (n * (n - 1) // 2)
    return work


def _strided_loads(
    segs: SplitSegments, strided: IntArray, cu: IntArray, prefix: IntArray
) -> tuple[IntArray, IntArray]:
    """``(tokens, work)`` per segment that crosses requests (round-robin: one per rank), cut
    at every request boundary: ``[segments, requests]`` closed forms."""
    g0, stride = segs.g0[strided][:, None], segs.stride[strided][:, None]
    last = g0 + stride * (segs.count[strided][:, None] - 1)
    lo = np.maximum(g0, cu[None, :-1])
    first = lo + (g0 - lo) % stride
    hi = np.minimum(last, cu[None, 1:] - 1)
    n = np.where(first <= hi, (hi - first) // stride + 1, 0)
    p0 = prefix[None, :] + first - cu[None, :-1]
    work = np.where(n > 0, _progression_work(p0, n, stride), 0)
    return n.sum(axis=1), work.sum(axis=1)


def _by_rank(ranks: IntArray, values: IntArray, cp_size: int) -> IntArray:
    """Sum of ``values`` per rank, ``[cp_size]``, exact in int64."""
    total = np.zeros(cp_size, np.int64)
    np.add.at(total, ranks, values)
    return total


def rank_load(
    segs: SplitSegments, extend_lens: Sequence[int], prefix_lens: Sequence[int]
) -> RankLoad:
    """The per-rank load of ``segs``, the split of a batch with these lengths.

    Under the ``none`` split every rank computes every token, and its load is the batch's.
    """
    extend = np.asarray(extend_lens, np.int64)
    prefix = np.asarray(prefix_lens, np.int64)
    cu = np.concatenate([[0], np.cumsum(extend)]).astype(np.int64)
    if segs.replicated:
        total = int(_progression_work(prefix, extend, np.ones_like(extend)).sum())
        return RankLoad((int(cu[-1]),) * segs.cp_size, (total,) * segs.cp_size)
    # NOTE: zigzag blocks and page runs lie inside one request: one closed form each. Only
    # round-robin's strided segments cross requests, and they are cut per request.
    first_req = np.searchsorted(cu, segs.g0, side="right") - 1
    last_req = np.searchsorted(cu, segs.g0 + segs.stride * (segs.count - 1), side="right") - 1
    inside = (segs.count > 0) & (first_req == last_req)
    unit, crossing = np.flatnonzero(inside), np.flatnonzero(~inside & (segs.count > 0))
    req, count, stride = first_req[unit], segs.count[unit], segs.stride[unit]
    p0 = prefix[req] + segs.g0[unit] - cu[req]
    tokens = _by_rank(segs.rank[unit], count, segs.cp_size)
    work = _by_rank(segs.rank[unit], _progression_work(p0, count, stride), segs.cp_size)
    if len(crossing):
        n, w = _strided_loads(segs, crossing, cu, prefix)
        tokens += _by_rank(segs.rank[crossing], n, segs.cp_size)
        work += _by_rank(segs.rank[crossing], w, segs.cp_size)
    return RankLoad(tuple(int(x) for x in tokens), tuple(int(x) for x in work))


def split_load(
    strategy: SplitStrategy,
    extend_lens: Sequence[int],
    prefix_lens: Sequence[int],
    page_tables: Sequence[IntArray],
    cp_size: int,
    page_size: int,
) -> RankLoad:
    """The per-rank load of a batch under ``strategy`` (page tables: the scheduled ones)."""
    flat, table_cu = flatten_tables(page_tables)
    runs = current_page_runs(extend_lens, prefix_lens, flat, table_cu, page_size)
    segs = build_segments(strategy, extend_lens, prefix_lens, cp_size, page_size, runs)
    return rank_load(segs, extend_lens, prefix_lens)


PAGE_INTERLEAVE_MAX_IMBALANCE = 1.25
"""The page-interleaved split is taken while the busiest rank's current tokens and causal
work are each at most this many times the mean (and no rank is idle). Chosen from
``cpkv bench``'s ``balance`` figure (page 64, cp 2/4/8): it keeps the page interleave on 93%
or more of the full-size ``trace synth`` presets' batches, and the busiest rank's work over
the trace within 1.16 of the mean on every preset, where the page interleave on every batch
reaches 1.83 (docs/phases/p4-page-aligned-split.md)."""


def owner_load(
    extend_lens: Sequence[int],
    prefix_lens: Sequence[int],
    page_tables: Sequence[IntArray],
    cp_size: int,
    page_size: int,
) -> RankLoad:
    """Each rank's load when every current page is computed by its owner: the load of the
    page-interleaved split. The scheduler records it on every ``ScheduledBatch``, so the
    gate's balance rule reads a field; it goes straight from the page runs (no segments,
    no request lookup), equal to ``split_load(PAGE_INTERLEAVED, ...)``."""
    runs = current_page_runs(extend_lens, prefix_lens, *flatten_tables(page_tables), page_size)
    ranks = owner_of_page(runs.page, cp_size)
    work = _progression_work(runs.position0, runs.count, np.ones_like(runs.count))
    return RankLoad(
        tuple(int(n) for n in _by_rank(ranks, runs.count, cp_size)),
        tuple(int(n) for n in _by_rank(ranks, work, cp_size)),
    )


def page_interleave_fits(load: RankLoad) -> bool:
    """The page-interleaved split's balance rule: no idle rank, and tokens and causal work
    of the busiest rank within ``PAGE_INTERLEAVE_MAX_IMBALANCE`` of the mean."""
    worst = max(load.tokens_max_over_mean, load.work_max_over_mean)
    return load.idle_ranks == 0 and worst <= PAGE_INTERLEAVE_MAX_IMBALANCE
