"""The host scheduler: the only page allocator, and one frozen ``ScheduledBatch`` per batch.

For each batch it checks every request against its state (``rules``), allocates the pages
of the current tokens and emits a ``ScheduledBatch``: page tables, the pages it allocated
and their owners, the owner of the page each chunk resumes in, lengths. The gate decides
from it, every CP rank and the reference run it, and the PD sender reads its page tables:
none of them allocates. A batch is scheduled as a whole or not at all, and the last batch
scheduled can be rolled back as a whole (``rollback``) when its run fails on some rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from cpkv_core.planning.allocator import AllocatorState, PageAllocator, PageTable, ceil_div
from cpkv_core.planning.balance import owner_load
from cpkv_core.planning.batch import BatchSpec, RequestSpec
from cpkv_core.planning.ownership import owner_of_page
from cpkv_core.planning.rules import batch_problem
from cpkv_core.planning.scheduled import NO_OWNER, ScheduledBatch, ScheduledRequest
from cpkv_core.planning.split_page_aligned import compute_owner_of_pages, short_requests
from cpkv_core.planning.tokens import rid_key

__all__ = [
    "NO_OWNER",
    "OwnerPolicy",
    "ScheduleError",
    "ScheduledBatch",
    "ScheduledRequest",
    "Scheduler",
    "SchedulerState",
    "pages_for_trace",
]


class OwnerPolicy(StrEnum):
    """Which owners the scheduler gives a batch's new pages."""

    DEALT = "dealt"
    """Consecutive pages of a request to consecutive owners (balanced within one page)."""
    COMPUTE_OWNER = "compute-owner"
    """Each page to the rank that computes it under the page-aligned split, when the batch
    can take that split; otherwise dealt."""
    BATCH_DEALT = "batch-dealt"
    """The batch's new pages dealt to consecutive owners in one cycle across its requests,
    from the owner with the most free pages: each request's pages stay interleaved, and the
    page-interleaved split (which computes every page on its owner) balances the batch."""


class ScheduleError(ValueError):
    """A batch does not follow from the scheduler's state; nothing was scheduled."""

    def __init__(self, batch: int, field: str, message: str) -> None:
        self.batch = batch
        self.field = field
        super().__init__(f"batch {batch}: {field}: {message}")


@dataclass(frozen=True, slots=True)
class SchedulerState:
    """Everything a scheduler holds, as plain values (tests and the debug checks compare
    the state before a failed batch with the state after its rollback)."""

    allocator: AllocatorState
    seq_lens: tuple[tuple[str, int], ...]
    """The token ledger: tokens each request holds, by rid."""


@dataclass(frozen=True, slots=True)
class _Undo:
    """What the last scheduled batch changed: per request, the pages and tokens it held
    before (``None`` tokens: the request is new)."""

    batch: int
    held: tuple[tuple[str, int, int | None], ...]


def pages_for_trace(batches: Sequence[BatchSpec], page_size: int, cp_size: int) -> int:
    """Logical pages that hold a whole trace whatever owners its pages go to.

    Shared prefix pages are counted once; each owner gets ``num_pages / cp_size`` pages, so
    any owner could hold the whole trace.
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
    pages = sum(ceil_div(n, page_size) - shared_pages[rid] for rid, n in seq_lens.items())
    return cp_size * (pages + 1)


class Scheduler:
    """Schedules batches one at a time against its allocator and token counts."""

    def __init__(self, num_pages: int, page_size: int, cp_size: int = 1) -> None:
        self.allocator = PageAllocator(num_pages, page_size, num_owners=cp_size)
        self.page_size = page_size
        self.cp_size = cp_size
        self._seq_lens: dict[str, int] = {}
        self._undo: _Undo | None = None

    def __contains__(self, rid: object) -> bool:
        return rid in self._seq_lens

    def seq_len(self, rid: str) -> int:
        """Tokens ``rid`` holds."""
        try:
            return self._seq_lens[rid]
        except KeyError:
            raise ValueError(f"unknown request {rid!r}; schedule it first") from None

    def page_table(self, rid: str) -> PageTable:
        """Logical pages of ``rid``."""
        return self.allocator.page_table(rid)

    def schedule(self, batch: BatchSpec, policy: OwnerPolicy = OwnerPolicy.DEALT) -> ScheduledBatch:
        """Checks, allocates and commits ``batch``; all or nothing.

        Raises:
            ScheduleError: A request breaks a chunk or prefix rule (see ``rules``).
            OutOfPagesError: The pool (or one owner) has too few free pages.
        """
        problem = batch_problem(batch, self._seq_lens, self.page_size)
        if problem is not None:
            raise ScheduleError(batch.batch, *problem)
        extend_lens = tuple(r.extend_len for r in batch.requests)
        prefix_lens = tuple(r.prefix_len for r in batch.requests)
        resume_owners = [self._resume_owner(r) for r in batch.requests]
        compute_owners = self._compute_owners(extend_lens, prefix_lens, policy)
        undo = _Undo(
            batch.batch,
            tuple((r.rid, self._pages_held(r), self._seq_lens.get(r.rid)) for r in batch.requests),
        )
        new_pages = self._allocate_all(batch, self._new_owners(batch, policy, compute_owners))
        self._undo = undo
        requests = tuple(
            ScheduledRequest(
                rid=r.rid,
                prefix_len=r.prefix_len,
                extend_len=r.extend_len,
                page_table=self.allocator.page_table(r.rid),
                rid_key=rid_key(r.rid),
                resume_page_owner=owner,
                return_logprob=r.return_logprob,
                capture_hidden=r.capture_hidden,
            )
            for r, owner in zip(batch.requests, resume_owners, strict=True)
        )
        self._seq_lens.update((r.rid, r.seq_len) for r in batch.requests)
        return ScheduledBatch(
            batch=batch.batch,
            spec=batch.spec,
            requests=requests,
            page_size=self.page_size,
            cp_size=self.cp_size,
            new_pages=new_pages,
            on_compute_owners=compute_owners is not None
            and all(
                resume in (NO_OWNER, owners[0])
                for resume, owners in zip(resume_owners, compute_owners, strict=True)
            ),
            extend_lens=extend_lens,
            prefix_lens=prefix_lens,
            current_pages=tuple(
                ceil_div(p + e, self.page_size) - p // self.page_size
                for p, e in zip(prefix_lens, extend_lens, strict=True)
            ),
            owner_load=owner_load(
                extend_lens,
                prefix_lens,
                [r.page_table for r in requests],
                self.cp_size,
                self.page_size,
            ),
        )

    def rollback(self, batch: int) -> None:
        """Undoes the last scheduled batch ``batch`` as a whole: page tables, free lists,
        refcounts and the token ledger are as they were before it, so scheduling the same
        batch again gives the same ``ScheduledBatch``.

        Raises:
            RuntimeError: ``batch`` is not the last batch scheduled, or a later change
                (another batch, a release) has committed it.
        """
        undo = self._undo
        if undo is None or undo.batch != batch:
            last = "none" if undo is None else f"batch {undo.batch}"
            raise RuntimeError(
                f"cannot roll back batch {batch}: only the last batch scheduled can be, before "
                f"anything else changes the scheduler (rollback-able now: {last})"
            )
        for rid, pages, tokens in reversed(undo.held):
            self.allocator.truncate(rid, pages)
            if tokens is None:
                del self._seq_lens[rid]
            else:
                self._seq_lens[rid] = tokens
        self._undo = None

    def state(self) -> SchedulerState:
        """A comparable copy of the allocator and the token ledger."""
        return SchedulerState(self.allocator.state(), tuple(sorted(self._seq_lens.items())))

    def release(self, rid: str) -> None:
        """Forgets ``rid``; its pages no other request holds are freed. Commits the last
        scheduled batch (it can no longer be rolled back)."""
        self.allocator.release(rid)
        del self._seq_lens[rid]
        self._undo = None

    def _resume_owner(self, req: RequestSpec) -> int:
        if req.prefix_len % self.page_size == 0 or req.rid not in self._seq_lens:
            return NO_OWNER
        return owner_of_page(int(self.allocator.page_table(req.rid)[-1]), self.cp_size)

    def _compute_owners(
        self, extend_lens: tuple[int, ...], prefix_lens: tuple[int, ...], policy: OwnerPolicy
    ) -> tuple[tuple[int, ...], ...] | None:
        """Per request the compute owner of each current page, when ``policy`` allocates by
        compute owner and the batch can take the page-aligned split; None otherwise."""
        if policy is not OwnerPolicy.COMPUTE_OWNER or short_requests(
            extend_lens, prefix_lens, self.cp_size, self.page_size
        ):
            return None
        return compute_owner_of_pages(extend_lens, prefix_lens, self.cp_size, self.page_size)

    def _new_owners(
        self,
        batch: BatchSpec,
        policy: OwnerPolicy,
        compute_owners: tuple[tuple[int, ...], ...] | None,
    ) -> list[Sequence[int] | None]:
        """Per request, the owner of each page it allocates (None: dealt per request)."""
        counts = [ceil_div(r.seq_len, self.page_size) - self._pages_kept(r) for r in batch.requests]
        if compute_owners is not None:
            # NOTE: a chunk resuming mid-page already holds its first page.
            pairs = zip(compute_owners, counts, strict=True)
            return [owners[len(owners) - n :] for owners, n in pairs]
        if policy is not OwnerPolicy.BATCH_DEALT:
            return [None] * len(counts)
        free = self.allocator.free_pages_by_owner()
        cursor = free.index(max(free))
        owners: list[Sequence[int] | None] = []
        for n in counts:
            owners.append([(cursor + i) % self.cp_size for i in range(n)])
            cursor = (cursor + n) % self.cp_size
        return owners

    def _allocate_all(self, batch: BatchSpec, new_owners: list[Sequence[int] | None]) -> PageTable:
        done: list[tuple[str, int]] = []
        new_pages = []
        try:
            for req, owners in zip(batch.requests, new_owners, strict=True):
                held = self._pages_held(req)
                shared = None
                if req.prefix_from is not None:
                    source = self.allocator.page_table(req.prefix_from)
                    shared = source[: req.prefix_len // self.page_size]
                num_pages = ceil_div(req.seq_len, self.page_size)
                new_pages.append(self.allocator.allocate(req.rid, num_pages, shared, owners))
                done.append((req.rid, held))
        except BaseException:
            for rid, held in reversed(done):
                self.allocator.truncate(rid, held)
            raise
        return np.concatenate(new_pages) if new_pages else np.empty(0, np.int64)

    def _pages_kept(self, req: RequestSpec) -> int:
        """Pages ``req`` starts the batch with: its own, or a new request's shared prefix."""
        if req.prefix_from is not None:
            return req.prefix_len // self.page_size
        return self._pages_held(req)

    def _pages_held(self, req: RequestSpec) -> int:
        return len(self.allocator.page_table(req.rid)) if req.rid in self.allocator else 0
