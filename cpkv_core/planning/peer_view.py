"""The history view of a peer-read batch: index math over page-table entries, numpy only.

Under peer-read a rank builds its view by reading the owners' pools directly (shared memory
on one host), so the view needs no slots of equal size: each owner's pages follow the
previous owner's, with no padding. Only pages holding history are in it (tokens committed
in earlier batches); the current chunk's keys come from the all-gathered current rows.
The key buffer a request reads is ``[history view ; current rows]``: a position below the
request's ``prefix_len`` reads ``entry_rows[entry] + position % page_size``, any other
position ``view_tokens + cu_extend[request] + position - prefix_len``.

Shared-prefix pages follow the plan's remap: one slot per page-table entry (slot remap) or
one per distinct page (unique remap).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from cpkv_core.planning.ownership import local_page, owner_of_page

__all__ = ["PeerViewPlan", "history_entries", "peer_view_plan"]

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class PeerViewPlan:
    """Which pages this rank reads from each owner, and the view row of every entry.

    Invariant: ``owner_rows`` ascends from 0 to ``view_tokens``; owner ``r``'s pages fill
    view rows ``owner_rows[r]:owner_rows[r + 1]`` in ``pages_by_owner[r]`` order.
    """

    cp_size: int
    page_size: int
    pages_by_owner: tuple[IntArray, ...]
    """Logical history pages read from each owner, in view order."""
    owner_rows: tuple[int, ...]
    """``[cp_size + 1]`` first view row of each owner's pages, then ``view_tokens``."""
    entry_rows: IntArray
    """``[total entries]`` view row of the first token of each history page-table entry;
    0 for an entry without history (never read through the view)."""

    @property
    def view_tokens(self) -> int:
        """Token rows of the history view; no padding."""
        return self.owner_rows[-1]

    @property
    def physical_pages(self) -> IntArray:
        """Every page read, as the physical page in its owner's pool, in view order."""
        pages = np.concatenate(self.pages_by_owner) if self.pages_by_owner else np.empty(0)
        physical: IntArray = local_page(pages.astype(np.int64), self.cp_size)
        return physical


def history_entries(table_lens: IntArray, prefix_lens: IntArray, page_size: int) -> BoolArray:
    """``[total entries]``: the page-table entries holding at least one history token."""
    request = np.repeat(np.arange(len(table_lens), dtype=np.int64), table_lens)
    first = np.cumsum(table_lens) - table_lens
    entry_in_request = np.arange(int(table_lens.sum()), dtype=np.int64) - first[request]
    has_history: BoolArray = entry_in_request * page_size < prefix_lens[request]
    return has_history


def peer_view_plan(
    flat_tables: IntArray, history: BoolArray, page_size: int, cp_size: int, unique: bool
) -> PeerViewPlan:
    """The history view of the entries ``history`` of ``flat_tables`` (every request's
    table, concatenated); ``unique`` reads a page shared by several entries once."""
    entries = np.flatnonzero(history)
    pages = flat_tables[entries].astype(np.int64)
    inverse = np.arange(len(pages), dtype=np.int64)
    if unique:
        pages, inverse = np.unique(pages, return_inverse=True)
        pages, inverse = pages.astype(np.int64), inverse.reshape(-1).astype(np.int64)
    owners = owner_of_page(pages, cp_size)
    order = np.argsort(owners, kind="stable")
    per_owner = np.bincount(owners, minlength=cp_size).astype(np.int64)
    owner_start = np.cumsum(per_owner) - per_owner
    slot = np.empty_like(order)
    slot[order] = np.arange(len(order), dtype=np.int64)
    entry_rows = np.zeros(len(flat_tables), np.int64)
    entry_rows[entries] = slot[inverse] * page_size
    sorted_pages = pages[order]
    by_owner = tuple(
        sorted_pages[owner_start[r] : owner_start[r] + per_owner[r]] for r in range(cp_size)
    )
    bounds = np.concatenate([[0], np.cumsum(per_owner)]) * page_size
    return PeerViewPlan(cp_size, page_size, by_owner, tuple(int(b) for b in bounds), entry_rows)
