"""Host-side metadata of one batch on one rank: built once per batch, before tensor work.

This is the "plan" half of plan/run: Python ints in, a few index tensors out, one copy to
the device. Every strategy is reduced here to index tables (which rows to write where,
which rows to send, where each request's keys are), so the run step is plain gathers and
scatters with shapes fixed by host metadata.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from itertools import accumulate

import torch
from torch import Tensor

from cpkv_core.planning.allocator import PageAllocator
from cpkv_core.planning.batch import BatchSpec
from cpkv_core.planning.execution import (
    ExecutionPlan,
    KvReadStrategy,
    KvWriteStrategy,
    SplitStrategy,
)
from cpkv_core.planning.ownership import owner_of_loc, physical_loc
from cpkv_core.planning.remap import ViewPlan, reuse_key_rows, slot_view_plan, unique_view_plan
from cpkv_core.planning.split import SplitMetadata, build_round_robin_split, build_zigzag_split
from cpkv_core.planning.split_page_aligned import build_page_aligned_zigzag_split


def int_tensor(values: Sequence[int]) -> Tensor:
    """An int64 tensor of host ints."""
    return torch.tensor(values, dtype=torch.int64)


class KeySource(StrEnum):
    """The buffer a request's keys are gathered from."""

    POOL = "pool"
    """The rank's own pool (replicated layout)."""
    VIEW = "view"
    """The materialized view gathered from the page owners."""
    CURRENT = "current"
    """The batch-order all-gathered current chunk."""


@dataclass(frozen=True, slots=True)
class WritePlan:
    """Which rows of the current chunk this rank stores, and where in its pool."""

    source_index: Tensor  # [m] rows of the gathered chunk, or of the local rows if from_local
    dest_rows: Tensor  # [m] rows of this rank's pool
    written_locs: Tensor  # [m] logical locs those rows hold
    from_local: bool = False
    """True when the rows come straight from this rank's own projections (no all-gather)."""


@dataclass(frozen=True, slots=True)
class ReadPlan:
    """Where keys come from; for a view, which pool rows this rank sends into it."""

    source: KeySource
    view: ViewPlan | None = None
    send_rows: Tensor | None = None  # [max_pages * page_size] pool rows; padding reads row 0


@dataclass(frozen=True, slots=True)
class RequestRows:
    """Where one request's queries sit on this rank and where its keys are."""

    local_rows: Tensor  # [m] rows of this rank's local tokens that belong to the request
    positions: Tensor  # [m] their logical positions
    key_rows: Tensor  # [seq_len] row of each logical position 0..seq_len-1 in the key source


@dataclass(frozen=True, slots=True)
class BatchLayout:
    """Host-built metadata of one batch on one rank; made once, before any tensor work."""

    split: SplitMetadata
    local_token_indices: Tensor  # [n_local] batch-global token index g of each local row
    local_token_ids: Tensor  # [n_local]
    local_positions: Tensor  # [n_local]
    current_locs: Tensor  # [num_tokens] logical loc of batch token g
    gather_index: Tensor  # [num_tokens] row of token g in the padded all-gather stack
    last_token_indices: Tensor  # [bs] batch-global index of each request's last token
    last_token_ranks: Tensor  # [bs] rank that computed each request's last token
    local_last_rows: Tensor  # [m] local rows holding a request's last token
    local_last_requests: Tensor  # [m] the request index of each of those rows
    requests: tuple[RequestRows, ...]  # only requests with tokens on this rank
    write: WritePlan
    read: ReadPlan


def build_write_plan(
    strategy: KvWriteStrategy,
    current_locs: Sequence[int],
    local: Sequence[int],
    rank: int,
    cp_size: int,
    page_size: int,
) -> WritePlan:
    """Replicated: every current token at its logical loc. Owner-filtered: only owned tokens
    of the gathered chunk, at their physical rows. Compute-owner direct: this rank's own
    tokens (``local``: their batch indices), all on pages it owns, at their physical rows."""
    if strategy is KvWriteStrategy.REPLICATED:
        every = int_tensor(current_locs)
        return WritePlan(int_tensor(range(len(current_locs))), every, every)
    if strategy is KvWriteStrategy.COMPUTE_OWNER_DIRECT:
        locs = [current_locs[g] for g in local]
        foreign = [loc for loc in locs if owner_of_loc(loc, page_size, cp_size) != rank]
        if foreign:
            raise RuntimeError(
                f"rank {rank} computes locs {foreign[:4]} on pages it does not own, indicates a "
                "bug in the gate (OWNER_MISMATCH must fall back)"
            )
        dest = [physical_loc(loc, page_size, cp_size) for loc in locs]
        return WritePlan(int_tensor(range(len(locs))), int_tensor(dest), int_tensor(locs), True)
    owned = [
        g for g, loc in enumerate(current_locs) if owner_of_loc(loc, page_size, cp_size) == rank
    ]
    owned_locs = [current_locs[g] for g in owned]
    dest = [physical_loc(loc, page_size, cp_size) for loc in owned_locs]
    return WritePlan(int_tensor(owned), int_tensor(dest), int_tensor(owned_locs))


def build_batch_split(
    strategy: SplitStrategy, batch: BatchSpec, cp_size: int, page_size: int
) -> SplitMetadata:
    """The split of ``batch`` under ``strategy``."""
    if strategy is SplitStrategy.ROUND_ROBIN:
        return build_round_robin_split(batch.extend_lens, cp_size)
    if strategy is SplitStrategy.PAGE_ALIGNED_ZIGZAG:
        prefix_lens = [req.prefix_len for req in batch.requests]
        return build_page_aligned_zigzag_split(batch.extend_lens, prefix_lens, cp_size, page_size)
    return build_zigzag_split(batch.extend_lens, cp_size)


def build_read_plan(
    strategy: KvReadStrategy,
    batch: BatchSpec,
    allocator: PageAllocator,
    rank: int,
    cp_size: int,
) -> tuple[ReadPlan, list[tuple[int, ...]]]:
    """The read plan and, per request, the rows of its keys in the plan's source."""
    rids = [req.rid for req in batch.requests]
    if strategy is KvReadStrategy.LOCAL_POOL:
        return ReadPlan(KeySource.POOL), [allocator.req_to_token(rid) for rid in rids]
    if strategy is KvReadStrategy.CURRENT_REUSE:
        if batch.has_history:
            raise RuntimeError(
                f"batch {batch.batch}: current reuse got a request with history, indicates a "
                "bug in the gate (HAS_HISTORY must fall back)"
            )
        return ReadPlan(KeySource.CURRENT), list(reuse_key_rows(batch.extend_lens))
    build = slot_view_plan if strategy is KvReadStrategy.MATERIALIZED_SLOT else unique_view_plan
    page_size = allocator.page_size
    view = build(
        [allocator.page_table(rid) for rid in rids],
        [req.seq_len for req in batch.requests],
        page_size,
        cp_size,
    )
    send_rows = [
        (page // cp_size) * page_size + offset
        for page in view.pages_by_owner[rank]
        for offset in range(page_size)
    ]
    send_rows += [0] * (view.max_pages * page_size - len(send_rows))
    return ReadPlan(KeySource.VIEW, view, int_tensor(send_rows)), list(view.key_rows)


def build_layout(
    batch: BatchSpec,
    plan: ExecutionPlan,
    split: SplitMetadata,
    rank: int,
    token_ids: Sequence[Sequence[int]],
    allocator: PageAllocator,
) -> BatchLayout:
    """The ``BatchLayout`` of ``batch`` on ``rank``; its pages must be allocated already.

    Args:
        token_ids: per request, the token ids of its current tokens.
    """
    cp_size, page_size = split.cp_size, allocator.page_size
    positions = [p for req in batch.requests for p in range(req.prefix_len, req.seq_len)]
    flat_token_ids = [t for ids in token_ids for t in ids]
    request_of_token = [i for i, req in enumerate(batch.requests) for _ in range(req.extend_len)]
    current_locs = [
        loc
        for req in batch.requests
        for loc in allocator.locs(req.rid, req.prefix_len, req.seq_len)
    ]
    read, key_rows = build_read_plan(plan.kv_read, batch, allocator, rank, cp_size)
    local = split.local_token_indices[rank]
    rows_of_request: dict[int, list[int]] = {}
    for row, g in enumerate(local):
        rows_of_request.setdefault(request_of_token[g], []).append(row)
    requests = tuple(
        RequestRows(
            local_rows=int_tensor(rows),
            positions=int_tensor([positions[local[row]] for row in rows]),
            key_rows=int_tensor(key_rows[index]),
        )
        for index, rows in sorted(rows_of_request.items())
    )
    last_tokens = [end - 1 for end in accumulate(batch.extend_lens)]
    owner_of_token = split.owner_of_token()
    row_of_token = {g: row for row, g in enumerate(local)}
    local_last = [(row_of_token[g], i) for i, g in enumerate(last_tokens) if g in row_of_token]
    return BatchLayout(
        split=split,
        local_token_indices=int_tensor(local),
        local_token_ids=int_tensor([flat_token_ids[g] for g in local]),
        local_positions=int_tensor([positions[g] for g in local]),
        current_locs=int_tensor(current_locs),
        gather_index=int_tensor(split.gather_index()),
        last_token_indices=int_tensor(last_tokens),
        last_token_ranks=int_tensor([owner_of_token[g] for g in last_tokens]),
        local_last_rows=int_tensor([row for row, _ in local_last]),
        local_last_requests=int_tensor([i for _, i in local_last]),
        requests=requests,
        write=build_write_plan(plan.kv_write, current_locs, local, rank, cp_size, page_size),
        read=read,
    )
