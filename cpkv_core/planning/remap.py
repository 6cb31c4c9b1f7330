"""Remap tables for reads under sharded KV: pure index math on host ints.

Full-view materialization gathers the pages a batch reads from their owners into a dense
per-call view. Every owner sends its pages into ``max_pages`` fixed slots, so after the
all-gather the view is ``[cp_size * max_pages * page_size]`` token rows and the row of a
slot is ``owner * max_pages + index_in_owner``. A request's keys are then read from the
view through ``key_rows``: one view row per logical position, so top-k indices stay in the
logical page-table domain whatever the read strategy.

- **Slot remap**: one slot per (request, page-table entry). A page shared by two requests
  (a prefix hit) fills two slots; the tables need no ``unique`` and their sizes follow
  from the page-table lengths alone.
- **Compact unique-page remap**: one slot per distinct page; smaller views when prefixes are
  shared, at the price of a ``unique`` over the batch's pages.

Current reuse needs no view: a current-only request's keys are exactly its current tokens,
which the all-gather already put in batch order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

from cpkv_core.planning.ownership import owner_of_page


@dataclass(frozen=True, slots=True)
class ViewPlan:
    """Which pages every owner sends, and where every request's keys sit in the view."""

    cp_size: int
    page_size: int
    pages_by_owner: tuple[tuple[int, ...], ...]
    """Logical pages each owner sends, in slot order; ``pages_by_owner[r]`` all owned by r."""
    key_rows: tuple[tuple[int, ...], ...]
    """Per request, the view row of each logical position ``0..seq_len-1``."""

    @property
    def max_pages(self) -> int:
        """Slots per owner in the gathered view (the largest owner's count)."""
        return max((len(pages) for pages in self.pages_by_owner), default=0)

    @property
    def view_tokens(self) -> int:
        """Token rows of the gathered view, padding included."""
        return self.cp_size * self.max_pages * self.page_size

    def page_of_view_row(self, row: int) -> int | None:
        """The logical page behind view ``row``; None for a padding row."""
        slot, _ = divmod(row, self.page_size)
        owner, index = divmod(slot, self.max_pages)
        pages = self.pages_by_owner[owner]
        return pages[index] if index < len(pages) else None


def _view_plan(
    slot_pages: Sequence[int],
    slot_of_entry: Sequence[Sequence[int]],
    seq_lens: Sequence[int],
    page_size: int,
    cp_size: int,
) -> ViewPlan:
    """Places slots by owner and maps every request position to its view row."""
    pages_by_owner: list[list[int]] = [[] for _ in range(cp_size)]
    place: list[tuple[int, int]] = []
    for page in slot_pages:
        owner = owner_of_page(page, cp_size)
        place.append((owner, len(pages_by_owner[owner])))
        pages_by_owner[owner].append(page)
    max_pages = max((len(p) for p in pages_by_owner), default=0)
    key_rows = tuple(
        tuple(
            (place[slots[pos // page_size]][0] * max_pages + place[slots[pos // page_size]][1])
            * page_size
            + pos % page_size
            for pos in range(seq_len)
        )
        for slots, seq_len in zip(slot_of_entry, seq_lens, strict=True)
    )
    return ViewPlan(cp_size, page_size, tuple(map(tuple, pages_by_owner)), key_rows)


def slot_view_plan(
    page_tables: Sequence[Sequence[int]], seq_lens: Sequence[int], page_size: int, cp_size: int
) -> ViewPlan:
    """One slot per (request, page-table entry); needs no ``unique``."""
    starts = [0, *accumulate(len(t) for t in page_tables)]
    slot_of_entry = [range(starts[i], starts[i + 1]) for i in range(len(page_tables))]
    slot_pages = [page for table in page_tables for page in table]
    return _view_plan(slot_pages, slot_of_entry, seq_lens, page_size, cp_size)


def unique_view_plan(
    page_tables: Sequence[Sequence[int]], seq_lens: Sequence[int], page_size: int, cp_size: int
) -> ViewPlan:
    """One slot per distinct page of the batch, in ascending page order."""
    slot_pages = sorted({page for table in page_tables for page in table})
    slot_of_page = {page: slot for slot, page in enumerate(slot_pages)}
    slot_of_entry = [[slot_of_page[page] for page in table] for table in page_tables]
    return _view_plan(slot_pages, slot_of_entry, seq_lens, page_size, cp_size)


def reuse_key_rows(extend_lens: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    """Rows of each current-only request's keys in the batch-order gathered current chunk."""
    starts = [0, *accumulate(extend_lens)]
    return tuple(tuple(range(starts[i], starts[i + 1])) for i in range(len(extend_lens)))
