"""Per-token rows across the ranks: all-gathered into batch order (the current chunk, the
full tail), and the tail's collectors of each request's last-token hidden state, one per
output strategy."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from cpkv_core.dist.comm import Communicator
from cpkv_core.planning import HostPlan, OutputStrategy
from cpkv_core.runtime.device_plan import BatchTensors


def all_gather_tokens(
    comm: Communicator, local: Tensor, host: HostPlan, tensors: BatchTensors, tag: str
) -> Tensor:
    """All-gathers per-token rows into batch order.

    Args:
        local: ``[n_local, ...]`` this rank's rows, in local order.

    Returns:
        ``[num_tokens, ...]`` every rank's rows, in batch order.
    """
    pad_rows = host.max_local - host.num_local
    if pad_rows:
        local = torch.cat([local, local.new_zeros((pad_rows, *local.shape[1:]))])
    stacked = comm.all_gather(local, tag)  # [cp_size, max_local, ...]
    return stacked.flatten(0, 1).index_select(0, tensors.gather_index)


def collect_full_gather(
    comm: Communicator, hidden: Tensor, host: HostPlan, tensors: BatchTensors
) -> Tensor:
    """Phase 0: all-gather every token's hidden state, then keep each request's last token.

    Returns:
        ``[bs, hidden]`` last-token hidden states, identical on every rank.
    """
    full = all_gather_tokens(comm, hidden, host, tensors, "tail_hidden")  # [num_tokens, h]
    return full.index_select(0, tensors.last_token_indices)


def collect_narrow_last_token(
    comm: Communicator, hidden: Tensor, host: HostPlan, tensors: BatchTensors
) -> Tensor:
    """Phase 1: each rank contributes ``[bs, hidden]`` holding the last-token states it
    computed (zeros elsewhere); after the gather each request's row comes from its last
    token's rank.

    Returns:
        ``[bs, hidden]`` last-token hidden states, identical on every rank.
    """
    bs = host.bs
    contribution = hidden.new_zeros(bs, hidden.shape[1]).index_copy_(
        0, tensors.local_last_requests, hidden.index_select(0, tensors.local_last_rows)
    )
    gathered = comm.all_gather(contribution, "tail_hidden")  # [cp_size, bs, hidden]
    rows = tensors.last_token_ranks * bs + torch.arange(bs, device=hidden.device)
    return gathered.flatten(0, 1).index_select(0, rows)


def collect_local_last_token(
    comm: Communicator, hidden: Tensor, host: HostPlan, tensors: BatchTensors
) -> Tensor:
    """The none split: this rank computed every token, so it picks each request's last-token
    state from its own rows and gathers nothing.

    Returns:
        ``[bs, hidden]`` last-token hidden states, identical on every rank.
    """
    return hidden.index_select(0, tensors.last_token_indices)


COLLECTORS: dict[
    OutputStrategy, Callable[[Communicator, Tensor, HostPlan, BatchTensors], Tensor]
] = {
    OutputStrategy.FULL_GATHER: collect_full_gather,
    OutputStrategy.NARROW_LAST_TOKEN: collect_narrow_last_token,
    OutputStrategy.LOCAL_LAST_TOKEN: collect_local_last_token,
}
