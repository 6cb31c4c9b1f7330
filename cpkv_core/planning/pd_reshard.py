"""PD re-shard: which decode rank owns each page position, and what every prefill rank writes
to every decode rank, step by step.

Pure index math (numpy). The prefill side owns a request's page position ``j`` by its
logical page, ``page_table[j] % cp_size`` (``owner_of_page``). The decode side runs
``dcp_size`` ranks and owns position ``j`` by page position, ``j % dcp_size``: its allocator
gives position ``j`` a logical page ``d`` with ``d % dcp_size == j % dcp_size`` (decode rank
``b`` holds local page ``k`` as logical page ``k * dcp_size + b``, the sharded pool's own
address rule), so both statements of ownership agree and a decode rank allocates from its
own free list with no coordination. Decode rank ``b`` stores its positions ``b, b +
dcp_size, ...`` as its local pages ``0, 1, ...``, in order; only its last local page can be
partly filled.

Each prefill rank writes each page it owns straight to the one decode rank that owns it.
Every decode rank gives an attempt its own receive slab of its tokens times the token
bytes; the pieces of one step go into it in prefill-rank order after the bytes earlier
steps placed there (one cursor per decode rank), so every prefill rank computes every
offset from the page table alone. ``dcp_size`` 1 is the non-CP decode server.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from cpkv_core.planning.ownership import owner_of_page
from cpkv_core.planning.pd_pack import split_by_capacity, tokens_of_positions

Ints = npt.NDArray[np.int64]

NOT_OWNED = -1
"""``decode_first_rows`` of a position another decode rank stores."""


def decode_owner(positions: Ints, dcp_size: int) -> Ints:
    """The decode rank that stores each page position."""
    return np.asarray(positions, dtype=np.int64) % dcp_size


def decode_positions(pages: int, dcp_rank: int, dcp_size: int) -> Ints:
    """The page positions ``dcp_rank`` stores of a request of ``pages`` pages, ascending."""
    return np.arange(dcp_rank, pages, dcp_size, dtype=np.int64)


def decode_tokens(seq_len: int, page_size: int, dcp_rank: int, dcp_size: int) -> int:
    """Tokens ``dcp_rank`` stores of a request of ``seq_len`` tokens."""
    positions = decode_positions(-(-seq_len // page_size), dcp_rank, dcp_size)
    return int(tokens_of_positions(positions, seq_len, page_size).sum())


def decode_first_rows(
    local_table: Ints, pages: int, page_size: int, dcp_rank: int, dcp_size: int
) -> Ints:
    """``[pages]`` the decode rank's pool row of each position's first token, or
    ``NOT_OWNED``.

    Args:
        local_table: ``[owned pages]`` the rank's pages of its positions, in position order.
    """
    rows = np.full(pages, NOT_OWNED, dtype=np.int64)
    owned = decode_positions(pages, dcp_rank, dcp_size)
    rows[owned] = np.asarray(local_table, dtype=np.int64)[: len(owned)] * page_size
    return rows


def pair_tokens(
    page_table: Ints,
    start: int,
    stop: int,
    seq_len: int,
    page_size: int,
    cp_size: int,
    dcp_size: int,
) -> Ints:
    """``[cp_size, dcp_size]`` tokens of positions ``[start, stop)`` by (prefill owner, decode
    owner): what each prefill rank writes to each decode rank."""
    positions = np.arange(start, stop, dtype=np.int64)
    src = owner_of_page(np.asarray(page_table, dtype=np.int64)[start:stop], cp_size)
    dst = decode_owner(positions, dcp_size)
    tokens = tokens_of_positions(positions, seq_len, page_size)
    flat = np.bincount(src * dcp_size + dst, weights=tokens, minlength=cp_size * dcp_size)
    return flat.astype(np.int64).reshape(cp_size, dcp_size)


def reshard_offsets(pairs: Ints, token_bytes: int, cursors: Sequence[int]) -> Ints:
    """``[dcp_size, cp_size + 1]`` slab offsets of one step's pieces: prefill rank ``a``'s
    piece for decode rank ``b`` is ``[out[b, a], out[b, a + 1])`` of ``b``'s slab, and
    ``out[b, cp_size]`` is ``b``'s cursor for the next step.

    Args:
        pairs: ``[cp_size, dcp_size]`` tokens (``pair_tokens``).
        cursors: ``[dcp_size]`` bytes earlier steps placed in each decode rank's slab.
    """
    per_dest = np.asarray(pairs, dtype=np.int64).T * token_bytes
    zeros = np.zeros((per_dest.shape[0], 1), dtype=np.int64)
    starts = np.asarray(cursors, dtype=np.int64)[:, None]
    offsets: Ints = starts + np.concatenate([zeros, np.cumsum(per_dest, axis=1)], axis=1)
    return offsets


@dataclass(frozen=True, slots=True)
class ReshardPiece:
    """One block a prefill rank writes to one decode rank's slab."""

    dest: int
    """The decode rank (``j % dcp_size`` of every position)."""
    offset: int
    """Byte offset in the destination's slab."""
    positions: Ints
    """Page positions the block holds, ascending."""


def reshard_pieces(
    page_table: Ints,
    start: int,
    stop: int,
    seq_len: int,
    page_size: int,
    cp_size: int,
    rank: int,
    dcp_size: int,
    token_bytes: int,
    cursors: Sequence[int],
    capacity: int,
) -> tuple[list[ReshardPiece], tuple[int, ...]]:
    """What prefill ``rank`` writes for the positions ``[start, stop)`` one step completed:
    per destination, the positions it owns there (cut to fit a staging buffer of
    ``capacity`` bytes), at their slab offsets.

    Returns:
        (the pieces, destination by destination; every decode rank's next cursor).
    """
    pairs = pair_tokens(page_table, start, stop, seq_len, page_size, cp_size, dcp_size)
    offsets = reshard_offsets(pairs, token_bytes, cursors)
    positions = np.arange(start, stop, dtype=np.int64)
    owners = owner_of_page(np.asarray(page_table, dtype=np.int64)[start:stop], cp_size)
    mine = positions[owners == rank]
    dests = decode_owner(mine, dcp_size)
    pieces = []
    for dest in range(dcp_size):
        offset = int(offsets[dest, rank])
        for run in split_by_capacity(mine[dests == dest], page_size, token_bytes, capacity):
            pieces.append(ReshardPiece(dest, offset, run))
            offset += int(tokens_of_positions(run, seq_len, page_size).sum()) * token_bytes
    return pieces, tuple(int(c) for c in offsets[:, cp_size])


def merge_runs(srcs: Ints, dsts: Ints, lengths: Ints) -> tuple[Ints, Ints, Ints]:
    """Descriptors ``(src, dst, length)`` merged where one continues the previous in both
    source and destination: ``src[i-1] + length[i-1] == src[i]`` and the same for ``dst``.

    Returns:
        ``(starts, counts, lengths)``: each merged descriptor is descriptors
        ``starts[k] .. starts[k] + counts[k] - 1`` of the input, ``lengths[k]`` bytes long
        from ``srcs[starts[k]]`` to ``dsts[starts[k]]``.
    """
    srcs, dsts = np.asarray(srcs, dtype=np.int64), np.asarray(dsts, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    if len(srcs) == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    continues = (srcs[:-1] + lengths[:-1] == srcs[1:]) & (dsts[:-1] + lengths[:-1] == dsts[1:])
    starts = np.flatnonzero(np.concatenate(([True], ~continues))).astype(np.int64)
    counts = np.diff(np.concatenate((starts, [len(srcs)]))).astype(np.int64)
    merged = np.add.reduceat(lengths, starts).astype(np.int64)
    return starts, counts, merged


def decode_pages_per_rank(seq_lens: Sequence[int], page_size: int, dcp_size: int) -> int:
    """Pages the busiest decode rank needs for requests of ``seq_lens`` tokens, each with
    one decode token after it (no prefix sharing on the decode side)."""
    pages = np.asarray([-(-(n + 1) // page_size) for n in seq_lens], dtype=np.int64)
    return int((-(-pages // dcp_size)).sum())
