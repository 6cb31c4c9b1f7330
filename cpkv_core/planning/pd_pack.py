"""PD packing: which token rows each prefill rank packs for a request, and where they land.

Pure index math (numpy). A rank sends the request's pages it owns (``page % cp_size``), each
with its logical page position ``j`` in the request, so the decode side can put it at
position ``j`` of its own page table. Under the replicated layout (levels 0 and 1) every
rank holds every page; the ranks still split the pages by the same ownership rule.

Sends stream: after each batch a rank sends the positions that batch completed (full
pages, and the last, partly filled page once the request's final chunk is written). The
positions are packed into a staging buffer as one block per piece, laid out layer by
layer and tensor by tensor (latent, index K, scale), each ``[tokens, row_bytes]`` with the
piece's tokens in position order. The decode side gives an attempt one receive slab of
``seq_len * token_bytes`` (one per decode rank, of that rank's tokens, with a CP decode
side); every rank computes where each rank's piece goes in it from the page tables alone
(``pd_reshard.reshard_pieces``), so no two ranks' pieces overlap and the slab is filled
exactly once, without a message per piece.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from cpkv_core.planning.ownership import local_page, owner_of_page

Ints = npt.NDArray[np.int64]


def completed_pages(seq_len: int, page_size: int, final: bool) -> int:
    """Page positions whose KV is complete once ``seq_len`` tokens are written.

    Full pages only, unless this was the request's final chunk: then its last, partly filled
    page is complete as well.
    """
    return -(-seq_len // page_size) if final else seq_len // page_size


def owned_positions(page_table: Ints, start: int, stop: int, rank: int, cp_size: int) -> Ints:
    """Positions in ``[start, stop)`` whose logical page ``rank`` owns, ascending."""
    positions = np.arange(start, stop, dtype=np.int64)
    pages = np.asarray(page_table, dtype=np.int64)[start:stop]
    owned: Ints = positions[owner_of_page(pages, cp_size) == rank]
    return owned


def tokens_of_positions(positions: Ints, seq_len: int, page_size: int) -> Ints:
    """Tokens stored at each page position (the last page may be partly filled)."""
    return np.minimum(page_size, seq_len - positions * page_size).astype(np.int64)


def token_rows(first_rows: Ints, positions: Ints, seq_len: int, page_size: int) -> Ints:
    """Pool rows of every token of ``positions``, in position then token order.

    Args:
        first_rows: ``[pages]`` the pool row of each position's first token.
        positions: ``[n]`` page positions of the request.
        seq_len: tokens of the request once complete.
    """
    counts = tokens_of_positions(positions, seq_len, page_size)
    starts = np.repeat(np.asarray(first_rows, dtype=np.int64)[positions], counts)
    ends = np.cumsum(counts)
    within = np.arange(int(ends[-1]) if len(ends) else 0, dtype=np.int64) - np.repeat(
        ends - counts, counts
    )
    return starts + within


@dataclass(frozen=True, slots=True)
class PageRuns:
    """Token rows in packing order, as the whole pool pages they begin with and the rows
    after them: a pack copies ``page_size`` rows at once where it can (pack.pack_rows)."""

    pages: Ints
    """``[p]`` pool page of each leading whole page: its rows are ``page * page_size`` on."""
    rest: Ints
    """``[r]`` pool rows after the whole pages (a partly filled last page, or rows that are
    no whole aligned page)."""
    page_size: int

    def __len__(self) -> int:
        """Token rows in all."""
        return len(self.pages) * self.page_size + len(self.rest)

    def rows(self) -> Ints:
        """Every token row again, in order."""
        within = np.arange(self.page_size, dtype=np.int64)
        whole = (self.pages[:, None] * self.page_size + within).reshape(-1)
        return np.concatenate([whole, self.rest]).astype(np.int64)


def page_runs(rows: Ints, page_size: int) -> PageRuns:
    """``rows`` cut after their longest prefix of whole pool pages: runs of ``page_size``
    consecutive rows that start at a multiple of ``page_size``. ``token_rows`` of owned
    positions are whole pages but for a request's partly filled last page."""
    rows = np.asarray(rows, dtype=np.int64)
    full = len(rows) // page_size
    by_page = rows[: full * page_size].reshape(full, page_size)
    heads = by_page[:, 0]
    aligned = heads % page_size == 0
    whole = (by_page == heads[:, None] + np.arange(page_size)).all(axis=1) & aligned
    leading = full if whole.all() else int(np.argmin(whole))
    return PageRuns(heads[:leading] // page_size, rows[leading * page_size :], page_size)


def sender_first_rows(page_table: Ints, page_size: int, cp_size: int, sharded: bool) -> Ints:
    """The prefill pool row of each position's first token: the owner's physical page under
    the sharded layout, the logical page itself under the replicated one."""
    pages = np.asarray(page_table, dtype=np.int64)
    return (local_page(pages, cp_size) if sharded else pages) * page_size


def split_by_capacity(
    positions: Ints, page_size: int, token_bytes: int, capacity: int
) -> list[Ints]:
    """``positions`` cut into consecutive runs that fit a staging buffer of ``capacity``
    bytes (whole pages per run; a page never spans two runs).

    Raises:
        ValueError: the staging buffer cannot hold one page.
    """
    page_bytes = page_size * token_bytes
    if capacity < page_bytes:
        raise ValueError(
            f"PD staging buffer needs at least one page ({page_bytes} bytes), got {capacity}"
        )
    per_run = capacity // page_bytes
    return [positions[i : i + per_run] for i in range(0, len(positions), per_run)]
