"""The host half of plan/run: one rank's plan of one batch, O(pages + requests), one buffer.

``build_host_plan`` reads a ``ScheduledBatch`` and the batch's strategies and reduces them
to small integer tables: split segments, per-request offsets, the base row of every
page-table entry in the key source, write runs per page, the pages this rank sends into a
view, the last tokens. Every table is built with vectorised numpy ops, never a Python loop
per token, and all of them are packed into one int64 buffer that the run step copies to its
device once and expands there into per-token indices (``runtime.device_plan``), with every
output size known here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import numpy.typing as npt

from cpkv_core.planning.execution import ExecutionPlan, KvReadStrategy, KvWriteStrategy
from cpkv_core.planning.ownership import local_page
from cpkv_core.planning.page_runs import current_page_runs, flatten_tables
from cpkv_core.planning.peer_view import PeerViewPlan, history_entries, peer_view_plan
from cpkv_core.planning.query_blocks import QueryBlock, split_query_blocks
from cpkv_core.planning.remap import ViewPlan, slot_view_plan, unique_view_plan
from cpkv_core.planning.scheduler import ScheduledBatch
from cpkv_core.planning.segments import SplitSegments, build_segments
from cpkv_core.planning.sglang_cp import gather_rows_per_rank
from cpkv_core.planning.write_runs import write_runs

__all__ = ["AttendedRequest", "HostPlan", "KeySource", "build_host_plan"]

IntArray = npt.NDArray[np.int64]


class KeySource(StrEnum):
    """The buffer a request's keys are gathered from."""

    POOL = "pool"
    """The rank's own pool (replicated layout)."""
    VIEW = "view"
    """The materialized view gathered from the page owners."""
    CURRENT = "current"
    """The batch-order all-gathered current chunk."""
    HISTORY_AND_CURRENT = "history+current"
    """Peer-read: ``[history view read from the owners' pools ; current chunk rows]``."""


@dataclass(frozen=True, slots=True)
class AttendedRequest:
    """A request with queries on this rank: its local rows and its rows of ``key_rows``."""

    index: int
    """Request index in the batch."""
    row_start: int
    row_end: int
    key_start: int
    key_end: int
    """``key_end - key_start`` is the request's ``seq_len``."""
    blocks: tuple[QueryBlock, ...]
    """Its local rows cut for the indexer, each block with the keys it sees."""


@dataclass(frozen=True, slots=True)
class HostPlan:
    """One rank's plan of one batch: sizes as host ints, tables in one int64 buffer.

    Invariant: every size the run step passes to an op (``output_size``, slice bounds,
    buffer shapes) is a field here, so expanding the buffer never reads a device value.
    """

    rank: int
    cp_size: int
    page_size: int
    strategies: ExecutionPlan
    key_source: KeySource
    bs: int
    num_tokens: int
    num_local: int
    max_local: int
    """Rows per rank in the padded all-gather of the current chunk (and the full tail
    gather): the busiest rank's rows, rounded up to a multiple of ``cp_size`` under the
    round-robin split as SGLang 0.5.23 pads it (``planning.sglang_cp``)."""
    local_start: int
    """Offset of this rank's tokens among the packed segments' tokens, rank-major."""
    num_segments: int
    """Segments packed: every rank's, or under the ``none`` split this rank's one."""
    attended: tuple[AttendedRequest, ...]
    num_keys: int
    num_written: int
    """Token rows this rank writes into its pool."""
    num_local_last: int
    """Requests whose last token this rank computed."""
    view: ViewPlan | None
    """The materialized view's plan (gathered view reads only)."""
    peer_view: PeerViewPlan | None
    """The history view's plan (peer-read view reads only)."""
    buffer: IntArray
    fields: Mapping[str, tuple[int, int]]
    """Name -> ``(offset, length)`` of each table in ``buffer``."""

    @property
    def write_from_local(self) -> bool:
        """The write reads this rank's own rows, not the gathered chunk: a direct write, or
        the ``none`` split (whose local rows are the whole chunk in batch order)."""
        return (
            self.strategies.kv_write is KvWriteStrategy.COMPUTE_OWNER_DIRECT
            or self.strategies.computes_every_token
        )

    @property
    def gathers_current(self) -> bool:
        """The run step all-gathers the current chunk: a split batch whose write or read
        needs every rank's rows. Under the ``none`` split every rank already holds them."""
        if self.strategies.computes_every_token:
            return False
        reads_current = self.key_source in (KeySource.CURRENT, KeySource.HISTORY_AND_CURRENT)
        return not self.write_from_local or reads_current

    @property
    def history_tokens(self) -> int:
        """Rows of the history view of a ``history+current`` read (0 otherwise); the current
        rows follow them in the key buffer."""
        if self.peer_view is not None:
            return self.peer_view.view_tokens
        if self.key_source is KeySource.HISTORY_AND_CURRENT and self.view is not None:
            return self.view.view_tokens
        return 0

    def table(self, name: str) -> IntArray:
        """The host copy of one table (tests and debug checks)."""
        offset, length = self.fields[name]
        return self.buffer[offset : offset + length]


def _pack(tables: Mapping[str, IntArray]) -> tuple[IntArray, dict[str, tuple[int, int]]]:
    fields, offset = {}, 0
    for name, table in tables.items():
        fields[name] = (offset, len(table))
        offset += len(table)
    parts = [np.asarray(t, dtype=np.int64) for t in tables.values()]
    return np.concatenate(parts) if parts else np.empty(0, np.int64), fields


def _rows_before(segs: SplitSegments, lo: int, hi: int, tokens: IntArray) -> IntArray:
    """Per entry of ``tokens``: this rank's tokens (segments ``lo:hi``) below it."""
    g0, count, stride = segs.g0[lo:hi], segs.count[lo:hi], segs.stride[lo:hi]
    inside = -(-(tokens[:, None] - g0[None, :]) // stride[None, :])
    rows: IntArray = np.clip(inside, 0, count[None, :]).sum(axis=1).astype(np.int64)
    return rows


@dataclass(frozen=True, slots=True)
class _Read:
    source: KeySource
    view: ViewPlan | None
    peer_view: PeerViewPlan | None
    key_base: IntArray
    """Per page-table entry: the key source's row of the entry's first token."""
    pages: IntArray
    """Gather: the physical pages this rank sends into its slots. Peer-read: the physical
    pages read, owner by owner, in view order."""


def _history(batch: ScheduledBatch) -> npt.NDArray[np.bool_]:
    """Per page-table entry of the batch: it holds history."""
    table_lens = np.asarray([len(r.page_table) for r in batch.requests], np.int64)
    prefix = np.asarray(batch.prefix_lens, np.int64)
    return history_entries(table_lens, prefix, batch.page_size)


def _read(
    batch: ScheduledBatch,
    plan: ExecutionPlan,
    rank: int,
    flat: IntArray,
    peer_read: bool,
    history_view: bool,
) -> _Read:
    empty = np.empty(0, np.int64)
    if plan.kv_read is KvReadStrategy.LOCAL_POOL:
        return _Read(KeySource.POOL, None, None, flat * batch.page_size, empty)
    if plan.kv_read is KvReadStrategy.CURRENT_REUSE:
        if batch.has_history:
            raise RuntimeError(
                f"batch {batch.batch}: current reuse got a request with history, indicates a "
                "bug in the gate (HAS_HISTORY must fall back)"
            )
        return _Read(KeySource.CURRENT, None, None, empty, empty)
    unique = plan.kv_read is KvReadStrategy.MATERIALIZED_UNIQUE
    if peer_read:
        peer = peer_view_plan(flat, _history(batch), batch.page_size, batch.cp_size, unique)
        return _Read(
            KeySource.HISTORY_AND_CURRENT, None, peer, peer.entry_rows, peer.physical_pages
        )
    build = unique_view_plan if unique else slot_view_plan
    if history_view:
        entries = np.flatnonzero(_history(batch))
        view = build(flat[entries], batch.page_size, batch.cp_size)
        key_base = np.zeros(len(flat), np.int64)
        key_base[entries] = view.entry_rows
        view = dataclasses.replace(view, entry_rows=key_base)
    else:
        view = build(flat, batch.page_size, batch.cp_size)
    send = np.zeros(view.max_pages, np.int64)
    mine = local_page(view.pages_by_owner[rank], batch.cp_size)
    send[: len(mine)] = mine
    source = KeySource.HISTORY_AND_CURRENT if history_view else KeySource.VIEW
    return _Read(source, view, None, view.entry_rows, send)


def _last_tokens(
    segs: SplitSegments, rank: int, last_tokens: IntArray
) -> tuple[IntArray, IntArray, IntArray]:
    """``(rank of each last token, local row of each, requests whose last token is
    local)``. Under the none split this rank holds every last token at its batch row."""
    if segs.replicated:
        bs = len(last_tokens)
        return np.full(bs, rank, np.int64), last_tokens, np.arange(bs, dtype=np.int64)
    last_ranks, last_rows = segs.rank_of_tokens(last_tokens)
    return last_ranks, last_rows, np.flatnonzero(last_ranks == rank)


def build_host_plan(
    batch: ScheduledBatch,
    plan: ExecutionPlan,
    rank: int,
    peer_read: bool = False,
    history_view: bool = False,
) -> HostPlan:
    """The ``HostPlan`` of ``batch`` on ``rank`` under ``plan``'s strategies.

    A view read becomes ``[history view ; current rows]`` with ``peer_read`` (history pages
    read from the owners' pools, unpadded) or ``history_view`` (history pages gathered into
    padded slots, so a layer's view can be fetched ahead of its compute)."""
    cp = batch.cp_size
    extend = np.asarray(batch.extend_lens, np.int64)
    prefix = np.asarray(batch.prefix_lens, np.int64)
    cu_extend = np.concatenate([[0], np.cumsum(extend)]).astype(np.int64)
    flat, table_cu = flatten_tables([r.page_table for r in batch.requests])
    runs = current_page_runs(batch.extend_lens, batch.prefix_lens, flat, table_cu, batch.page_size)
    segs = build_segments(
        plan.split, batch.extend_lens, batch.prefix_lens, cp, batch.page_size, runs
    )
    num_local = segs.num_local
    lo, hi = (int(i) for i in np.searchsorted(segs.rank, [rank, rank + 1]))
    # NOTE: under the none split every rank's segment is the same; pack only this rank's.
    packed = slice(lo, hi) if segs.replicated else slice(0, len(segs.rank))
    row_bounds = _rows_before(segs, lo, hi, cu_extend)
    attended_index = np.flatnonzero(row_bounds[1:] > row_bounds[:-1])
    seq = prefix + extend
    key_cu = np.concatenate([[0], np.cumsum(seq[attended_index])]).astype(np.int64)
    starts, ends = row_bounds[attended_index], row_bounds[attended_index + 1]
    blocks = split_query_blocks(
        segs, lo, hi, (starts, ends), cu_extend[attended_index], prefix[attended_index]
    )
    attended = tuple(
        AttendedRequest(int(i), int(r0), int(r1), int(k0), int(k1), b)
        for i, r0, r1, k0, k1, b in zip(
            attended_index, starts, ends, key_cu[:-1], key_cu[1:], blocks, strict=True
        )
    )
    read = _read(batch, plan, rank, flat, peer_read, history_view)
    writes = write_runs(batch, plan, rank, runs, segs)
    last_tokens = cu_extend[1:] - 1
    last_ranks, last_rows, local_last = _last_tokens(segs, rank, last_tokens)
    buffer, fields = _pack(
        {
            "cu_extend": cu_extend,
            "prefix_lens": prefix,
            "rid_keys": np.asarray([r.rid_key for r in batch.requests], np.int64),
            "seg_rank": segs.rank[packed],
            "seg_g0": segs.g0[packed],
            "seg_count": segs.count[packed],
            "seg_stride": segs.stride[packed],
            "seg_row0": segs.row0[packed],
            "seg_first": np.cumsum(segs.count[packed]) - segs.count[packed],
            "table_cu": table_cu,
            "key_base": read.key_base,
            "att_req": attended_index,
            "att_key_lo": key_cu[:-1],
            "att_seq": seq[attended_index],
            **writes,
            "write_first": np.cumsum(writes["write_count"]) - writes["write_count"],
            "send_pages": read.pages,
            "last_tokens": last_tokens,
            # NOTE: the row of each request's last token in the narrow tail's gather,
            # ``[cp_size * bs]`` rank-major: a table, so the tail picks without index math.
            "gathered_last_rows": last_ranks * len(last_ranks) + np.arange(len(last_ranks)),
            "local_last_rows": last_rows[local_last],
            "local_last_requests": local_last,
        }
    )
    return HostPlan(
        rank=rank,
        cp_size=cp,
        page_size=batch.page_size,
        strategies=plan,
        key_source=read.source,
        bs=len(batch.requests),
        num_tokens=segs.num_tokens,
        num_local=int(num_local[rank]),
        max_local=gather_rows_per_rank(int(num_local.max(initial=0)), plan.split, cp),
        local_start=0 if segs.replicated else int(num_local[:rank].sum()),
        num_segments=len(segs.rank[packed]),
        attended=attended,
        num_keys=int(key_cu[-1]),
        num_written=int(writes["write_count"].sum()),
        num_local_last=len(local_last),
        view=read.view,
        peer_view=read.peer_view,
        buffer=buffer,
        fields=fields,
    )
