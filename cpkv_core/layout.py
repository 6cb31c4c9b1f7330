"""Host-side metadata of one batch on one rank: built once per batch, before tensor work.

This is the "plan" half of plan/run: Python ints in, a few index tensors out, one copy to
the device. Nothing here touches KV or calls a collective.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

import torch
from torch import Tensor

from cpkv_core.allocator import PageAllocator
from cpkv_core.batch import BatchSpec
from cpkv_core.split import SplitMetadata


@dataclass(frozen=True, slots=True)
class RequestRows:
    """Where one request's tokens sit on this rank."""

    local_rows: Tensor  # [m] rows of this rank's local tokens that belong to the request
    positions: Tensor  # [m] their logical positions
    key_locs: Tensor  # [seq_len] logical locs of positions 0..seq_len-1 (req_to_token)


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


def _int_tensor(values: Sequence[int]) -> Tensor:
    return torch.tensor(values, dtype=torch.int64)


def build_layout(
    batch: BatchSpec,
    split: SplitMetadata,
    rank: int,
    token_ids: Sequence[Sequence[int]],
    allocator: PageAllocator,
) -> BatchLayout:
    """The ``BatchLayout`` of ``batch`` on ``rank``; its pages must be allocated already.

    Args:
        token_ids: per request, the token ids of its current tokens.
    """
    positions = [p for req in batch.requests for p in range(req.prefix_len, req.seq_len)]
    flat_token_ids = [t for ids in token_ids for t in ids]
    request_of_token = [i for i, req in enumerate(batch.requests) for _ in range(req.extend_len)]
    local = split.local_token_indices[rank]
    rows_of_request: dict[int, list[int]] = {}
    for row, g in enumerate(local):
        rows_of_request.setdefault(request_of_token[g], []).append(row)
    requests = tuple(
        RequestRows(
            local_rows=_int_tensor(rows),
            positions=_int_tensor([positions[local[row]] for row in rows]),
            key_locs=_int_tensor(allocator.req_to_token(batch.requests[index].rid)),
        )
        for index, rows in sorted(rows_of_request.items())
    )
    last_tokens = [end - 1 for end in accumulate(batch.extend_lens)]
    owner_of_token = split.owner_of_token()
    row_of_token = {g: row for row, g in enumerate(local)}
    local_last = [(row_of_token[g], i) for i, g in enumerate(last_tokens) if g in row_of_token]
    current_locs = [
        loc
        for req in batch.requests
        for loc in allocator.locs(req.rid, req.prefix_len, req.seq_len)
    ]
    return BatchLayout(
        split=split,
        local_token_indices=_int_tensor(local),
        local_token_ids=_int_tensor([flat_token_ids[g] for g in local]),
        local_positions=_int_tensor([positions[g] for g in local]),
        current_locs=_int_tensor(current_locs),
        gather_index=_int_tensor(split.gather_index()),
        last_token_indices=_int_tensor(last_tokens),
        last_token_ranks=_int_tensor([owner_of_token[g] for g in last_tokens]),
        local_last_rows=_int_tensor([row for row, _ in local_last]),
        local_last_requests=_int_tensor([i for _, i in local_last]),
        requests=requests,
    )
