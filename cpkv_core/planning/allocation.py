"""Which pages a batch gets: the one allocation policy shared by the engine and the planner.

Every rank and the host-side planner call ``allocate_batch`` with the same batch and plan,
so all of them agree on every logical page and its owner without a word exchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from cpkv_core.planning.allocator import PageAllocator, pages_needed_for_trace
from cpkv_core.planning.batch import BatchSpec
from cpkv_core.planning.execution import ExecutionPlan, KvWriteStrategy
from cpkv_core.planning.ownership import owner_of_page
from cpkv_core.planning.split_page_aligned import compute_owner_of_pages


def pages_for_trace(batches: Sequence[BatchSpec], page_size: int, cp_size: int) -> int:
    """Logical pages that hold a whole trace whatever owners its pages go to.

    Each owner gets ``num_pages / cp_size`` pages, so every owner could hold the trace.
    """
    return cp_size * (pages_needed_for_trace(batches, page_size) + 1)


def allocate_batch(allocator: PageAllocator, batch: BatchSpec, plan: ExecutionPlan) -> None:
    """Allocates every request of ``batch`` in order.

    Under compute-owner writes each new page goes to the rank that computes it (the
    page-aligned split's owner); otherwise pages are dealt to owners in turn.
    """
    owners_by_request: Sequence[Sequence[int] | None] = [None] * len(batch.requests)
    if plan.kv_write is KvWriteStrategy.COMPUTE_OWNER_DIRECT:
        compute_owners = compute_owner_of_pages(
            [r.extend_len for r in batch.requests],
            [r.prefix_len for r in batch.requests],
            allocator.num_owners,
            allocator.page_size,
        )
        owners_by_request = [
            owners[len(owners) - allocator.new_pages_needed(req) :]
            for req, owners in zip(batch.requests, compute_owners, strict=True)
        ]
    for req, owners in zip(batch.requests, owners_by_request, strict=True):
        allocator.allocate(req, owners)


def with_first_page_owners(batch: BatchSpec, allocator: PageAllocator) -> BatchSpec:
    """``batch`` with each request's ``first_page_owner`` read from the page tables.

    Call before the batch is allocated: a chunk that resumes mid-page resumes in the last
    page its request already holds.
    """
    requests = []
    for req in batch.requests:
        owner = None
        if req.prefix_len % allocator.page_size and req.rid in allocator:
            last_page = allocator.page_table(req.rid)[-1]
            owner = owner_of_page(last_page, allocator.num_owners)
        requests.append(dataclasses.replace(req, first_page_owner=owner))
    return dataclasses.replace(batch, requests=tuple(requests))
