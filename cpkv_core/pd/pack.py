"""PD packing: which pages each prefill rank sends for a request, and where they land.

Pure index math. Each rank sends the request's pages it owns (``page % cp_size``), each with
its logical page position in the request, so the decode side can put it at position ``j`` of
its own page table. Under the replicated layout (levels 0 and 1) every rank holds every page;
the ranks then split the pages by the same ownership rule rather than all sending all, so
each sends about ``1/cp_size`` of the request at every level.

Pages that are consecutive both in the sender's pool and in the decode pool merge into one
run: one transfer per run and tensor instead of one per page.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cpkv_core.planning.ownership import local_page, owner_of_page


@dataclass(frozen=True, slots=True)
class PageRun:
    """Token rows contiguous in the sender's pool and in the decode pool."""

    positions: tuple[int, ...]
    """Logical page positions in the request (page-table indices) the run covers."""
    src_row: int
    """First token row in the sender's pool."""
    dst_row: int
    """First token row in the decode pool."""
    tokens: int
    """Token rows in the run (the request's last page may be partly filled)."""


def pages_of_rank(page_table: Sequence[int], rank: int, cp_size: int) -> list[int]:
    """Positions of the request's pages that ``rank`` sends (the pages it owns)."""
    return [j for j, page in enumerate(page_table) if owner_of_page(page, cp_size) == rank]


def runs_for_rank(
    page_table: Sequence[int],
    dst_page_table: Sequence[int],
    seq_len: int,
    page_size: int,
    cp_size: int,
    rank: int,
    sharded: bool,
) -> list[PageRun]:
    """The merged runs ``rank`` sends for one request.

    Args:
        page_table: the request's logical pages on the prefill side.
        dst_page_table: the decode side's pages for the same positions.
        seq_len: tokens of the request.
        sharded: the sender's pool holds owned pages only (``page // cp_size``); otherwise
            it holds every logical page at its own index.
    """
    runs: list[PageRun] = []
    for j in pages_of_rank(page_table, rank, cp_size):
        page = page_table[j]
        src = (local_page(page, cp_size) if sharded else page) * page_size
        dst = dst_page_table[j] * page_size
        tokens = min(page_size, seq_len - j * page_size)
        last = runs[-1] if runs else None
        if last and last.src_row + last.tokens == src and last.dst_row + last.tokens == dst:
            runs[-1] = PageRun(
                (*last.positions, j), last.src_row, last.dst_row, last.tokens + tokens
            )
        else:
            runs.append(PageRun((j,), src, dst, tokens))
    return runs
