"""The device half of plan/run: one copy of a ``HostPlan``'s buffer, expanded on the device.

``upload`` copies the packed tables to the run device in one transfer (pinned and
non-blocking on CUDA). ``expand`` turns them into the per-token indices the run step uses:
local token ids and positions, the all-gather's batch-order index, key rows, write rows,
send rows. Every op here takes its output size from the host plan (``repeat_interleave``
with ``output_size``, ``arange`` of host ints, slices of host bounds) and reads no device
value, so it runs on ``meta`` and inside a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from cpkv_core.planning.host_plan import HostPlan, KeySource
from cpkv_core.planning.tokens import token_ids

__all__ = ["BatchTensors", "expand", "upload"]


@dataclass(frozen=True, slots=True)
class BatchTensors:
    """Per-token indices of one batch on one rank, on the run device."""

    local_token_indices: Tensor  # [n_local] batch token g of each local row
    local_token_ids: Tensor  # [n_local]
    local_positions: Tensor  # [n_local] logical positions
    gather_index: Tensor  # [num_tokens] row of token g in the padded all-gather stack
    key_rows: Tensor  # [num_keys] rows of every attended request's keys in the key source
    # [num_written] rows of the gathered chunk (or of the local rows); None when the write
    # takes every row of its source in order (``write_source_rows`` spells it out)
    write_source: Tensor | None
    write_dest: Tensor  # [num_written] rows of this rank's pool
    written_locs: Tensor  # [num_written] logical locs of those rows
    # gather: [max_pages] pool pages sent into a view's slots (padding reads page 0);
    # peer-read: [history pages] owners' pool pages read, owner by owner, in view order
    # (their rows: ``kv_pool.page_rows``)
    send_pages: Tensor
    last_token_indices: Tensor  # [bs]
    gathered_last_rows: Tensor  # [bs] row of each last token in the narrow tail's gather
    local_last_rows: Tensor  # [num_local_last]
    local_last_requests: Tensor  # [num_local_last]

    def write_source_rows(self) -> Tensor:
        """``write_source``, the identity spelled out when it is None."""
        if self.write_source is not None:
            return self.write_source
        return torch.arange(len(self.write_dest), dtype=torch.int64, device=self.write_dest.device)


def upload(plan: HostPlan, device: torch.device) -> Tensor:
    """The plan's buffer on ``device``, in one copy."""
    host = torch.from_numpy(plan.buffer)
    if device.type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    if device.type == "meta":
        return torch.empty(host.shape, dtype=host.dtype, device=device)
    return host.to(device)


class _Tables:
    """Named views into the uploaded buffer."""

    def __init__(self, plan: HostPlan, packed: Tensor) -> None:
        self.plan, self.packed = plan, packed

    def __getitem__(self, name: str) -> Tensor:
        offset, length = self.plan.fields[name]
        return self.packed[offset : offset + length]


def _arange(n: int, like: Tensor) -> Tensor:
    return torch.arange(n, dtype=torch.int64, device=like.device)


def _runs(starts: Tensor, counts: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """``(run of each element, offset in its run)`` of ``n`` elements in runs of ``counts``."""
    run = torch.repeat_interleave(_arange(len(counts), counts), counts, output_size=n)
    return run, _arange(n, counts) - starts[run]


def _split_tokens(plan: HostPlan, t: _Tables) -> tuple[Tensor, Tensor]:
    """``(batch token g of every rank's rows rank-major, its all-gather row)``."""
    counts = t["seg_count"]
    seg, offset = _runs(t["seg_first"], counts, plan.num_tokens)
    tokens = t["seg_g0"][seg] + t["seg_stride"][seg] * offset
    rows = t["seg_rank"][seg] * plan.max_local + t["seg_row0"][seg] + offset
    return tokens, rows


def _key_rows(plan: HostPlan, t: _Tables) -> Tensor:
    att_seq = t["att_seq"]
    which, positions = _runs(t["att_key_lo"], att_seq, plan.num_keys)
    request = t["att_req"][which]
    if plan.key_source is KeySource.CURRENT:
        return t["cu_extend"][request] + positions
    entry = t["table_cu"][request] + positions // plan.page_size
    pooled = t["key_base"][entry] + positions % plan.page_size
    if plan.key_source is not KeySource.HISTORY_AND_CURRENT:
        return pooled
    # NOTE: history positions read the view, current ones the gathered rows after it.
    prefix = t["prefix_lens"][request]
    current = plan.history_tokens + t["cu_extend"][request] + positions - prefix
    return torch.where(positions < prefix, pooled, current)


def _writes_source_in_order(plan: HostPlan) -> bool:
    """The batch writes every row of its source in order: its own rows (a direct write, or
    a replicated write under the ``none`` split) or the whole gathered chunk (a replicated
    write). Its write source is then the identity, and the write needs no gather of the
    rows before it (a copy of them all)."""
    source_rows = plan.num_local if plan.write_from_local else plan.num_tokens
    if plan.num_written != source_rows:
        return False
    count = plan.table("write_count")
    return bool(np.array_equal(plan.table("write_src0"), np.cumsum(count) - count))


def expand(plan: HostPlan, packed: Tensor, vocab_size: int) -> BatchTensors:
    """Expands the uploaded tables (``upload``) into the batch's per-token indices."""
    t = _Tables(plan, packed)
    tokens, rows = _split_tokens(plan, t)
    gather_index = torch.zeros_like(tokens).index_copy_(0, tokens, rows)
    local = tokens[plan.local_start : plan.local_start + plan.num_local]
    cu_extend = t["cu_extend"]
    extend_lens = cu_extend[1:] - cu_extend[:-1]
    request_of_token = torch.repeat_interleave(
        _arange(plan.bs, packed), extend_lens, output_size=plan.num_tokens
    )
    request = request_of_token[local]
    positions = t["prefix_lens"][request] + local - cu_extend[request]
    run, offset = _runs(t["write_first"], t["write_count"], plan.num_written)
    return BatchTensors(
        local_token_indices=local,
        local_token_ids=token_ids(t["rid_keys"][request], positions, vocab_size),
        local_positions=positions,
        gather_index=gather_index,
        key_rows=_key_rows(plan, t),
        write_source=None if _writes_source_in_order(plan) else t["write_src0"][run] + offset,
        write_dest=t["write_dst0"][run] + offset,
        written_locs=t["write_loc0"][run] + offset,
        send_pages=t["send_pages"],
        last_token_indices=t["last_tokens"],
        gathered_last_rows=t["gathered_last_rows"],
        local_last_rows=t["local_last_rows"],
        local_last_requests=t["local_last_requests"],
    )
