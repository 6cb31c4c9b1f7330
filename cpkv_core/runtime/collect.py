"""Token all-gathers of the run step: the current chunk's KV into batch order, and the
tail's collection of each request's last-token hidden state (phase 0's full gather, phase
1's narrow gather, or none under the ``none`` split).

Each takes the group's ``Communicator``, the rank's ``HostPlan`` (sizes) and its
``BatchTensors`` (indices), and reads no device value on the host.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from cpkv_core.dist.comm import Communicator
from cpkv_core.planning import HostPlan, OutputStrategy
from cpkv_core.runtime.device_plan import BatchTensors
from cpkv_core.runtime.kv_pool import KVRows

__all__ = [
    "COLLECTORS",
    "all_gather_tokens",
    "collect_full_gather",
    "collect_local_last_token",
    "collect_narrow_last_token",
    "gather_current",
]


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


def gather_current(
    comm: Communicator, own: KVRows, host: HostPlan, tensors: BatchTensors, tag: str = ""
) -> KVRows:
    """The current chunk's KV of every rank, in batch order (``own``: this rank's rows),
    counted under ``current_kv`` and ``current_index_k``, or all under ``tag``."""
    return KVRows(
        latent=all_gather_tokens(comm, own.latent, host, tensors, tag or "current_kv"),
        index_k=all_gather_tokens(comm, own.index_k, host, tensors, tag or "current_index_k"),
        index_k_scale=all_gather_tokens(
            comm, own.index_k_scale, host, tensors, tag or "current_index_k"
        ),
    )


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
    contribution = _last_token_rows(hidden, host, tensors)
    gathered = comm.all_gather(contribution, "tail_hidden")  # [cp_size, bs, hidden]
    return gathered.flatten(0, 1).index_select(0, tensors.gathered_last_rows)


def _last_token_rows(hidden: Tensor, host: HostPlan, tensors: BatchTensors) -> Tensor:
    """``[bs, hidden]``: the state of each request whose last token is local, zeros for
    the others.

    A rank holds the last token of every request or of none in most batches (under the
    zigzag split rank 0 holds every request's last chunk): the rows are then one select,
    or zeros, instead of zeros, a select and a scatter. At a few rows a chunk those are
    kernel launches, not bytes.
    """
    # NOTE: the host plan's counts pick the path, so no device value is read; they are the
    # tables' lengths, so a CUDA graph replayed for a plan of the same fields takes the same
    # path. ``local_last_requests`` lists requests in order: holding all, it is arange(bs).
    if host.num_local_last == host.bs:
        return hidden.index_select(0, tensors.local_last_rows)
    zeros = hidden.new_zeros(host.bs, hidden.shape[1])
    if host.num_local_last == 0:
        return zeros
    local = hidden.index_select(0, tensors.local_last_rows)
    return zeros.index_copy_(0, tensors.local_last_requests, local)


def collect_local_last_token(
    comm: Communicator, hidden: Tensor, host: HostPlan, tensors: BatchTensors
) -> Tensor:
    """The none split: this rank computed every token, so it picks each request's last-token
    state from its own rows and gathers nothing.

    Returns:
        ``[bs, hidden]`` last-token hidden states, identical on every rank.
    """
    return hidden.index_select(0, tensors.last_token_indices)


Collector = Callable[[Communicator, Tensor, HostPlan, BatchTensors], Tensor]

COLLECTORS: dict[OutputStrategy, Collector] = {
    OutputStrategy.FULL_GATHER: collect_full_gather,
    OutputStrategy.NARROW_LAST_TOKEN: collect_narrow_last_token,
    OutputStrategy.LOCAL_LAST_TOKEN: collect_local_last_token,
}
"""The tail's collector of each output strategy."""
