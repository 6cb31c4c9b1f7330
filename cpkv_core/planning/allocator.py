"""Logical page allocator: page tables, prefix sharing and ``req_to_token`` on the host.

Every CP rank runs the same allocator on the same batches and must get the same logical
pages, so free pages are handed out in ascending order and nothing depends on hashing.

Pages have owners (``owner_of_page``: ``page % num_owners``, one owner per CP rank under
sharded KV). The allocator keeps one free list per owner and, unless told which owners to
use, deals a request's consecutive pages to consecutive owners, so every request's pages
are balanced across ranks within one page.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from cpkv_core.planning.batch import BatchSpec, RequestSpec
from cpkv_core.planning.ownership import owner_of_page

__all__ = ["OutOfPagesError", "PageAllocator", "pages_needed_for_trace"]


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


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class PageAllocator:
    """Hands out logical pages to requests and keeps their page tables.

    Positions ``[0, seq_len)`` of a request live at logical locs
    ``page_table[pos // page_size] * page_size + pos % page_size``. A new request with
    ``prefix_from`` shares the source's first ``prefix_len // page_size`` pages (reference
    counted); its own tokens and every later chunk go to pages only it holds, so a shared
    page is never written.

    Invariant: a page is in use iff its refcount is >= 1, iff it is not in its owner's free
    list; its refcount equals the number of page tables holding it; every page table holds
    exactly ``ceil(seq_len / page_size)`` pages.
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
        self._refcount: list[int] = [0] * num_pages
        self._page_tables: dict[str, list[int]] = {}
        self._seq_lens: dict[str, int] = {}

    # -- queries ----------------------------------------------------------------------

    def __contains__(self, rid: object) -> bool:
        return rid in self._page_tables

    @property
    def num_free_pages(self) -> int:
        """Pages not held by any request."""
        return sum(len(free) for free in self._free)

    @property
    def num_pages_in_use(self) -> int:
        """Pages held by at least one request."""
        return self.num_pages - self.num_free_pages

    def pages_in_use_by_owner(self) -> list[int]:
        """Pages in use per owner."""
        counts = [0] * self.num_owners
        for page, n in enumerate(self._refcount):
            if n > 0:
                counts[owner_of_page(page, self.num_owners)] += 1
        return counts

    @property
    def pages_in_use(self) -> frozenset[int]:
        """Logical ids of the pages held by at least one request."""
        return frozenset(p for p, n in enumerate(self._refcount) if n > 0)

    def refcount(self, page: int) -> int:
        """Number of requests whose page table holds ``page`` (0 when free)."""
        if not 0 <= page < self.num_pages:
            raise ValueError(f"page must be in [0, {self.num_pages}), got {page}")
        return self._refcount[page]

    def page_table(self, rid: str) -> tuple[int, ...]:
        """Logical page ids of ``rid``, in position order."""
        return tuple(self._table(rid))

    def seq_len(self, rid: str) -> int:
        """Tokens ``rid`` holds."""
        self._table(rid)
        return self._seq_lens[rid]

    def req_to_token(self, rid: str) -> tuple[int, ...]:
        """Logical locs of positions ``[0, seq_len)`` of ``rid``."""
        return self.locs(rid, 0, self.seq_len(rid))

    def locs(self, rid: str, start: int, end: int) -> tuple[int, ...]:
        """Logical locs of positions ``[start, end)`` of ``rid``."""
        table, size = self._table(rid), self.page_size
        if not 0 <= start <= end <= self._seq_lens[rid]:
            raise ValueError(
                f"positions [{start}, {end}) are outside [0, {self._seq_lens[rid]}) of {rid!r}"
            )
        return tuple(table[pos // size] * size + pos % size for pos in range(start, end))

    # -- updates ----------------------------------------------------------------------

    def new_pages_needed(self, req: RequestSpec) -> int:
        """Pages ``allocate(req)`` would take from the free lists."""
        held = self._page_tables.get(req.rid)
        already = len(held) if held is not None else req.prefix_len // self.page_size
        return _ceil_div(req.seq_len, self.page_size) - already

    def allocate(self, req: RequestSpec, owners: Sequence[int] | None = None) -> None:
        """Gives ``req`` the pages for positions ``[0, seq_len)``.

        A continuation fills its partly filled last page first, then takes new pages. A new
        request with ``prefix_from`` shares the source's first ``prefix_len // page_size``
        pages. All or nothing: on any error the allocator is unchanged.

        Args:
            req: the request's part of the batch.
            owners: the owner of each new page, in position order (compute-owner
                allocation); by default consecutive new pages go to consecutive owners,
                starting after the owner of the request's last page (or, for a request
                with no page yet, at the owner with the most free pages).

        Raises:
            ValueError: ``req`` does not follow from the allocator's state (continuation
                with the wrong ``prefix_len``, unknown or too short ``prefix_from``,
                unaligned shared prefix), or ``owners`` has the wrong length.
            OutOfPagesError: Too few free pages (on some owner).
        """
        shared = self._pages_to_share(req)
        table = self._page_tables.get(req.rid, shared)
        needed = _ceil_div(req.seq_len, self.page_size) - len(table)
        if owners is None:
            owners = self._balanced_owners(table, needed)
        elif len(owners) != needed:
            raise ValueError(f"{req.rid!r} takes {needed} new pages, got {len(owners)} owners")
        self._check_free(owners)
        new_pages = [heapq.heappop(self._free[owner]) for owner in owners]
        for page in shared + new_pages:
            self._refcount[page] += 1
        self._page_tables[req.rid] = table + new_pages
        self._seq_lens[req.rid] = req.seq_len

    def release(self, rid: str) -> None:
        """Drops ``rid``; pages no other request holds go back to the free list."""
        table = self._table(rid)
        for page in table:
            self._refcount[page] -= 1
            if self._refcount[page] == 0:
                heapq.heappush(self._free[owner_of_page(page, self.num_owners)], page)
        del self._page_tables[rid], self._seq_lens[rid]

    def check_invariants(self) -> None:
        """Raises AssertionError if the class invariant is broken (a bug)."""
        counts = [0] * self.num_pages
        for rid, table in self._page_tables.items():
            want = _ceil_div(self._seq_lens[rid], self.page_size)
            assert len(table) == want, f"{rid!r}: {len(table)} pages for {want} needed"
            for page in table:
                counts[page] += 1
        assert counts == self._refcount, f"refcounts {self._refcount} != holders {counts}"
        free_pages = [page for free in self._free for page in free]
        free = set(free_pages)
        assert len(free) == len(free_pages), f"free lists have duplicates: {self._free}"
        for owner, pages in enumerate(self._free):
            assert all(owner_of_page(p, self.num_owners) == owner for p in pages), owner
        in_use = {p for p, n in enumerate(counts) if n > 0}
        assert free.isdisjoint(in_use), f"pages both free and in use: {free & in_use}"
        assert len(free) + len(in_use) == self.num_pages, "a page is neither free nor in use"

    # -- helpers ----------------------------------------------------------------------

    def _balanced_owners(self, table: list[int], needed: int) -> list[int]:
        if table:
            first = owner_of_page(table[-1], self.num_owners) + 1
        else:
            sizes = [len(free) for free in self._free]
            first = sizes.index(max(sizes))
        return [(first + i) % self.num_owners for i in range(needed)]

    def _check_free(self, owners: Sequence[int]) -> None:
        for owner in set(owners):
            wanted = sum(1 for o in owners if o == owner)
            if not 0 <= owner < self.num_owners:
                raise ValueError(f"owner must be in [0, {self.num_owners}), got {owner}")
            if wanted > len(self._free[owner]):
                raise OutOfPagesError(wanted, len(self._free[owner]), self.num_pages, owner)

    def _table(self, rid: str) -> list[int]:
        try:
            return self._page_tables[rid]
        except KeyError:
            raise ValueError(f"unknown request {rid!r}; allocate it first") from None

    def _pages_to_share(self, req: RequestSpec) -> list[int]:
        """Checks ``req`` against the state; returns the source pages it shares (new rid)."""
        if req.extend_len < 0:
            raise ValueError(f"{req.rid!r}: extend_len must be >= 0, got {req.extend_len}")
        if req.rid in self._page_tables:
            self._check_continuation(req)
            return []
        if req.prefix_from is None:
            if req.prefix_len != 0:
                raise ValueError(
                    f"new request {req.rid!r} has prefix_len={req.prefix_len} but no "
                    "prefix_from; name the request it shares the prefix with"
                )
            return []
        return self._shared_pages(req, req.prefix_from)

    def _check_continuation(self, req: RequestSpec) -> None:
        held = self._seq_lens[req.rid]
        if req.prefix_from is not None:
            raise ValueError(
                f"{req.rid!r} continues an earlier chunk; prefix_from must be None, got "
                f"{req.prefix_from!r}"
            )
        if req.prefix_len != held:
            raise ValueError(
                f"{req.rid!r} holds {held} tokens, so prefix_len must be {held}, got "
                f"{req.prefix_len}"
            )

    def _shared_pages(self, req: RequestSpec, source: str) -> list[int]:
        table, held = self._table(source), self._seq_lens[source]
        if req.prefix_len <= 0 or req.prefix_len % self.page_size:
            raise ValueError(
                f"{req.rid!r}: a shared prefix must be a positive multiple of page_size="
                f"{self.page_size}, got prefix_len={req.prefix_len}"
            )
        if req.prefix_len > held:
            raise ValueError(
                f"{req.rid!r}: prefix_len={req.prefix_len} exceeds the {held} tokens "
                f"{source!r} holds"
            )
        return table[: req.prefix_len // self.page_size]


def pages_needed_for_trace(batches: Sequence[BatchSpec], page_size: int) -> int:
    """Pages a ``PageAllocator`` uses for ``batches`` if no request is released.

    Shared prefix pages are counted once. Assumes the trace passed ``validate_trace``.
    """
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    seq_lens: dict[str, int] = {}
    shared_pages: dict[str, int] = {}
    for batch in batches:
        for req in batch.requests:
            if req.rid not in seq_lens:
                shared_pages[req.rid] = req.prefix_len // page_size if req.prefix_from else 0
            seq_lens[req.rid] = req.seq_len
    return sum(_ceil_div(n, page_size) - shared_pages[rid] for rid, n in seq_lens.items())
