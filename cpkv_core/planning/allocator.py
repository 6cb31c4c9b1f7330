"""Logical page allocator: page tables and prefix sharing on the host, in numpy.

The scheduler owns the only instance; engines, the reference and the PD sender read the page
tables it hands out in each ``ScheduledBatch``. Free pages are handed out in ascending order
and nothing depends on hashing, so a run is reproducible.

Pages have owners (``owner_of_page``: ``page % num_owners``, one owner per CP rank under
sharded KV). The allocator keeps one free list per owner and, unless told which owners to
use, deals a request's consecutive pages to consecutive owners, so every request's pages
are balanced across ranks within one page. Page tables are int64 arrays: appending a chunk
and sharing a prefix cost numpy copies, never a Python loop per page.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from cpkv_core.planning.ownership import owner_of_page

__all__ = ["AllocatorState", "OutOfPagesError", "PageAllocator", "PageTable", "ceil_div"]

PageTable = npt.NDArray[np.int64]
"""A request's logical pages in position order, ``[ceil(seq_len / page_size)]``."""


class OutOfPagesError(RuntimeError):
    """The pool has too few free pages for an allocation; nothing was allocated."""

    def __init__(self, needed: int, free: int, total: int, owner: int | None = None) -> None:
        self.needed = needed
        self.free = free
        self.total = total
        self.owner = owner
        where = "" if owner is None else f" on owner {owner}"
        super().__init__(
            f"out of KV pages{where}: need {needed} more, {free} free of {total}; raise "
            "num_pages (pages_needed_for_trace sizes a pool for a whole trace) or release "
            "requests"
        )

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.needed, self.free, self.total, self.owner))


def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` for ints."""
    return -(-a // b)


@dataclass(frozen=True, slots=True)
class AllocatorState:
    """Everything an allocator holds, as plain values: equal states allocate alike."""

    tables: tuple[tuple[str, tuple[int, ...]], ...]
    """Every request's page table, by rid."""
    free: tuple[tuple[int, ...], ...]
    """Each owner's free pages, ascending (a heap pops the least, whatever its order)."""
    refcount: tuple[int, ...]
    """Holders of each page."""


class PageAllocator:
    """Hands out logical pages to requests and keeps their page tables.

    Position ``pos`` of a request lives at logical loc
    ``page_table[pos // page_size] * page_size + pos % page_size``. A new request may start
    from a copy of another's first pages (a shared prefix, reference counted); its own tokens
    go to pages only it holds, so a shared page is never written.

    Invariant: a page is in use iff its refcount is >= 1, iff it is not in its owner's free
    list; its refcount equals the number of page tables holding it.
    """

    def __init__(self, num_pages: int, page_size: int, num_owners: int = 1) -> None:
        if num_pages < 0:
            raise ValueError(f"num_pages must be >= 0, got {num_pages}")
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        if num_owners < 1:
            raise ValueError(f"num_owners must be >= 1, got {num_owners}")
        self.num_pages = num_pages
        self.page_size = page_size
        self.num_owners = num_owners
        # NOTE: one min-heap per owner; ascending ranges are valid heaps already.
        self._free: list[list[int]] = [
            list(range(owner, num_pages, num_owners)) for owner in range(num_owners)
        ]
        self._refcount = np.zeros(num_pages, dtype=np.int64)
        self._tables: dict[str, PageTable] = {}

    # -- queries ----------------------------------------------------------------------

    def __contains__(self, rid: object) -> bool:
        return rid in self._tables

    @property
    def num_free_pages(self) -> int:
        """Pages not held by any request."""
        return sum(len(free) for free in self._free)

    def free_pages_by_owner(self) -> list[int]:
        """Free pages per owner."""
        return [len(free) for free in self._free]

    @property
    def num_pages_in_use(self) -> int:
        """Pages held by at least one request."""
        return self.num_pages - self.num_free_pages

    def pages_in_use_by_owner(self) -> list[int]:
        """Pages in use per owner."""
        return [
            int(n)
            for n in np.bincount(
                owner_of_page(self.pages_in_use_array(), self.num_owners),
                minlength=self.num_owners,
            )
        ]

    def pages_in_use_array(self) -> PageTable:
        """Logical ids of the pages held by at least one request, ascending."""
        return np.flatnonzero(self._refcount > 0).astype(np.int64)

    @property
    def pages_in_use(self) -> frozenset[int]:
        """Logical ids of the pages held by at least one request."""
        return frozenset(int(p) for p in self.pages_in_use_array())

    def state(self) -> AllocatorState:
        """A comparable copy of everything the allocator holds (tests, debug checks)."""
        return AllocatorState(
            tables=tuple(
                sorted((rid, tuple(int(p) for p in t)) for rid, t in self._tables.items())
            ),
            free=tuple(tuple(sorted(free)) for free in self._free),
            refcount=tuple(int(n) for n in self._refcount),
        )

    def refcount(self, page: int) -> int:
        """Number of requests whose page table holds ``page`` (0 when free)."""
        if not 0 <= page < self.num_pages:
            raise ValueError(f"page must be in [0, {self.num_pages}), got {page}")
        return int(self._refcount[page])

    def page_table(self, rid: str) -> PageTable:
        """Logical page ids of ``rid``, in position order (a read-only array)."""
        try:
            return self._tables[rid]
        except KeyError:
            raise ValueError(f"unknown request {rid!r}; allocate it first") from None

    # -- updates ----------------------------------------------------------------------

    def allocate(
        self,
        rid: str,
        num_pages: int,
        shared: PageTable | None = None,
        owners: Sequence[int] | None = None,
    ) -> PageTable:
        """Grows ``rid``'s page table to ``num_pages`` pages; returns the new pages.

        All or nothing: on any error the allocator is unchanged.

        Args:
            rid: A request; a new one starts from ``shared`` (or empty).
            num_pages: Pages the table holds afterwards.
            shared: A new request's shared prefix pages (another table's first pages).
            owners: The owner of each new page, in position order (compute-owner
                allocation); by default consecutive new pages go to consecutive owners,
                starting after the owner of the table's last page (or, for an empty table,
                at the owner with the most free pages).

        Raises:
            ValueError: ``owners`` has the wrong length or an owner out of range.
            OutOfPagesError: Too few free pages (on some owner).
        """
        held = self._tables.get(rid)
        if held is None:
            held = np.empty(0, np.int64) if shared is None else shared
        elif shared is not None:
            raise RuntimeError(f"{rid!r} is allocated already; only a new rid shares a prefix")
        needed = num_pages - len(held)
        if needed < 0:
            raise RuntimeError(f"{rid!r} holds {len(held)} pages, cannot shrink to {num_pages}")
        if owners is None:
            owners = self._balanced_owners(held, needed)
        elif len(owners) != needed:
            raise ValueError(f"{rid!r} takes {needed} new pages, got {len(owners)} owners")
        self._check_free(owners)
        new_pages = np.array([heapq.heappop(self._free[owner]) for owner in owners], dtype=np.int64)
        if rid not in self._tables:
            self._refcount[held] += 1
        self._refcount[new_pages] += 1
        table = np.concatenate([held, new_pages])
        table.flags.writeable = False
        self._tables[rid] = table
        return new_pages

    def truncate(self, rid: str, num_pages: int) -> None:
        """Undoes growth: keeps ``rid``'s first ``num_pages`` pages, frees the rest; with
        ``num_pages == 0`` drops a request that had no page before (a rolled-back batch)."""
        table = self.page_table(rid)
        for page in table[num_pages:]:
            self._unref(int(page))
        if num_pages == 0:
            self._drop(rid, table[:0])
        else:
            self._tables[rid] = table[:num_pages]

    def release(self, rid: str) -> None:
        """Drops ``rid``; pages no other request holds go back to the free list."""
        self._drop(rid, self.page_table(rid))

    def check_invariants(self) -> None:
        """Raises AssertionError if the class invariant is broken (a bug)."""
        counts = np.zeros(self.num_pages, dtype=np.int64)
        for table in self._tables.values():
            np.add.at(counts, table, 1)
        assert np.array_equal(counts, self._refcount), "refcounts differ from the holders"
        free_pages = [page for free in self._free for page in free]
        free = set(free_pages)
        assert len(free) == len(free_pages), f"free lists have duplicates: {self._free}"
        for owner, pages in enumerate(self._free):
            assert all(owner_of_page(p, self.num_owners) == owner for p in pages), owner
        in_use = {int(p) for p in np.flatnonzero(counts)}
        assert free.isdisjoint(in_use), f"pages both free and in use: {free & in_use}"
        assert len(free) + len(in_use) == self.num_pages, "a page is neither free nor in use"

    # -- helpers ----------------------------------------------------------------------

    def _drop(self, rid: str, table: PageTable) -> None:
        for page in table:
            self._unref(int(page))
        del self._tables[rid]

    def _unref(self, page: int) -> None:
        self._refcount[page] -= 1
        if self._refcount[page] == 0:
            heapq.heappush(self._free[owner_of_page(page, self.num_owners)], page)

    def _balanced_owners(self, table: PageTable, needed: int) -> list[int]:
        if len(table):
            first = owner_of_page(int(table[-1]), self.num_owners) + 1
        else:
            sizes = [len(free) for free in self._free]
            first = sizes.index(max(sizes))
        return [(first + i) % self.num_owners for i in range(needed)]

    def _check_free(self, owners: Sequence[int]) -> None:
        for owner in set(owners):
            if not 0 <= owner < self.num_owners:
                raise ValueError(f"owner must be in [0, {self.num_owners}), got {owner}")
            wanted = sum(1 for o in owners if o == owner)
            if wanted > len(self._free[owner]):
                raise OutOfPagesError(wanted, len(self._free[owner]), self.num_pages, owner)
