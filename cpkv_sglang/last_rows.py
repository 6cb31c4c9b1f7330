"""Where each request's last token lives after SGLang 0.5.23's CP split: its rank, and its
row among that rank's local rows (:func:`last_token_places`). Host integer math, no torch.

Read from the wheel:

- zigzag (``srt/layers/cp/zigzag.py``): a request's current tokens are cut into
  ``2 * cp_size`` blocks (``split_list``, ``bs * 2 * cp_size`` sizes in request order);
  rank ``r`` holds blocks ``r`` and ``2 * cp_size - 1 - r`` of every request, its local rows
  being the chunks ``zigzag_index`` lists, in that order (every request's block ``r``,
  then every request's block ``2 * cp_size - 1 - r``).
- interleave (``srt/layers/cp/interleave.py``): token ``t`` of the batch is on rank
  ``t % cp_size`` at local row ``t // cp_size``.

Padding rows (``padding.py``) follow a rank's logical rows, so they never move these.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

__all__ = ["LastTokenPlaces", "interleave_places", "last_token_places", "zigzag_places"]


@dataclass(frozen=True, slots=True)
class LastTokenPlaces:
    """Each request's last token: the rank that computed it, and this rank's local rows of
    the last tokens it holds."""

    owners: tuple[int, ...]
    """``[bs]`` rank of each request's last token."""
    mine: tuple[int, ...]
    """The requests whose last token this rank holds, in order."""
    local_rows: tuple[int, ...]
    """``[len(mine)]`` their rows among this rank's local rows."""


def zigzag_places(
    split_list: Sequence[int], zigzag_index: Sequence[int], cp_size: int, rank: int
) -> LastTokenPlaces:
    """The places under zigzag, from this rank's metadata (``split_list``, ``zigzag_index``)."""
    segments = 2 * cp_size
    bs = len(split_list) // segments
    owners = []
    last_chunk = []
    for i in range(bs):
        blocks = split_list[i * segments : (i + 1) * segments]
        block = max(b for b, size in enumerate(blocks) if size > 0)
        owners.append(block if block < cp_size else segments - 1 - block)
        last_chunk.append(i * segments + block)
    # NOTE: the local rows are the chunks of zigzag_index, in order; a chunk's first row is
    # the sum of the sizes before it.
    starts = list(accumulate((split_list[c] for c in zigzag_index), initial=0))
    where = {chunk: k for k, chunk in enumerate(zigzag_index)}
    mine = tuple(i for i in range(bs) if owners[i] == rank)
    rows = tuple(starts[where[last_chunk[i]]] + split_list[last_chunk[i]] - 1 for i in mine)
    return LastTokenPlaces(tuple(owners), mine, rows)


def interleave_places(extend_lens: Sequence[int], cp_size: int, rank: int) -> LastTokenPlaces:
    """The places under interleave, from the requests' current tokens."""
    last = [end - 1 for end in accumulate(extend_lens)]
    owners = tuple(t % cp_size for t in last)
    mine = tuple(i for i, owner in enumerate(owners) if owner == rank)
    return LastTokenPlaces(owners, mine, tuple(last[i] // cp_size for i in mine))


def last_token_places(
    kind: str,
    extend_lens: Sequence[int],
    cp_size: int,
    rank: int,
    split_list: Sequence[int] | None = None,
    zigzag_index: Sequence[int] | None = None,
) -> LastTokenPlaces:
    """The places under SGLang's strategy ``kind`` (``zigzag`` or ``interleave``).

    Raises:
        ValueError: an unknown strategy, or zigzag without its metadata lists.
    """
    if kind == "interleave":
        return interleave_places(extend_lens, cp_size, rank)
    if kind != "zigzag":
        raise ValueError(f"strategy must be zigzag or interleave, got {kind!r}")
    if split_list is None or zigzag_index is None:
        raise ValueError("zigzag needs the metadata's split_list and zigzag_index")
    return zigzag_places(split_list, zigzag_index, cp_size, rank)
