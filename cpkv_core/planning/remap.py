"""Remap tables for reads under sharded KV: vectorised index math over page-table entries.

Full-view materialization gathers the pages a batch reads from their owners into a dense
per-call view. Every owner sends its pages into ``max_pages`` fixed slots, so after the
all-gather the view is ``[cp_size * max_pages * page_size]`` token rows and the first row
of a slot is ``(owner * max_pages + index_in_owner) * page_size``. A request's keys are then
read from the view through one row per logical position, so top-k indices stay in the
logical page-table domain whatever the read strategy.

- **Slot remap**: one slot per (request, page-table entry). A page shared by two requests
  (a prefix hit) fills two slots; the tables need no ``unique`` and their sizes follow
  from the page-table lengths alone.
- **Compact unique-page remap**: one slot per distinct page; smaller views when prefixes are
  shared, at the price of a ``unique`` over the batch's pages.

Everything here is O(page-table entries) in numpy; per-token rows are expanded by the run
step on its device (``key_rows`` spells the expansion out on the host for tests).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from cpkv_core.planning.ownership import owner_of_page

__all__ = ["ViewPlan", "slot_view_plan", "unique_view_plan"]

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class ViewPlan:
    """Which pages every owner sends, and the view row of every page-table entry."""

    cp_size: int
    page_size: int
    max_pages: int
    """Slots per owner in the gathered view (the largest owner's count)."""
    pages_by_owner: tuple[IntArray, ...]
    """Logical pages each owner sends, in slot order; ``pages_by_owner[r]`` all owned by r."""
    entry_rows: IntArray
    """``[total entries]`` view row of the first token of each page-table entry."""

    @property
    def view_tokens(self) -> int:
        """Token rows of the gathered view, padding included."""
        return self.cp_size * self.max_pages * self.page_size

    def key_rows(self, entries: slice, seq_len: int) -> IntArray:
        """View row of positions ``0..seq_len-1`` of one request (host expansion, for tests
        and checks; the run step expands the same on its device)."""
        positions = np.arange(seq_len, dtype=np.int64)
        rows: IntArray = self.entry_rows[entries][positions // self.page_size]
        return rows + positions % self.page_size

    def page_of_view_row(self, row: int) -> int | None:
        """The logical page behind view ``row``; None for a padding row."""
        slot, _ = divmod(row, self.page_size)
        owner, index = divmod(slot, self.max_pages)
        pages = self.pages_by_owner[owner]
        return int(pages[index]) if index < len(pages) else None


def _place(
    slot_pages: IntArray, cp_size: int, page_size: int
) -> tuple[int, tuple[IntArray, ...], IntArray]:
    """Slots by owner: ``(max_pages, pages_by_owner, first view row of each slot)``."""
    owners = owner_of_page(slot_pages, cp_size)
    order = np.argsort(owners, kind="stable")
    per_owner = np.bincount(owners, minlength=cp_size)
    owner_start = np.cumsum(per_owner) - per_owner
    index_in_owner = np.empty_like(order)
    index_in_owner[order] = np.arange(len(order)) - owner_start[owners[order]]
    max_pages = int(per_owner.max(initial=0))
    sorted_pages = slot_pages[order]
    pages_by_owner = tuple(
        sorted_pages[owner_start[r] : owner_start[r] + per_owner[r]] for r in range(cp_size)
    )
    slot_rows = (owners * max_pages + index_in_owner) * page_size
    return max_pages, pages_by_owner, slot_rows.astype(np.int64)


def slot_view_plan(flat_tables: IntArray, page_size: int, cp_size: int) -> ViewPlan:
    """One slot per page-table entry of the batch (``flat_tables``: every request's table,
    concatenated); needs no ``unique``."""
    max_pages, by_owner, rows = _place(flat_tables, cp_size, page_size)
    return ViewPlan(cp_size, page_size, max_pages, by_owner, rows)


def unique_view_plan(flat_tables: IntArray, page_size: int, cp_size: int) -> ViewPlan:
    """One slot per distinct page of the batch, in ascending page order."""
    pages, inverse = np.unique(flat_tables, return_inverse=True)
    max_pages, by_owner, rows = _place(pages.astype(np.int64), cp_size, page_size)
    return ViewPlan(cp_size, page_size, max_pages, by_owner, rows[inverse.reshape(-1)])
