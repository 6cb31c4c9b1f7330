"""The ops the real-rows bench times on rank 0 of one grid point: the engine's own calls on
the engine's own index plans, with the bytes each writes counted from the plan's sizes.

Every op is one layer's (``per = "layer"``) or one chunk's (``per = "chunk"``, the tail):

- ``view``: materialization of the batch's view: ``slot`` and ``unique`` remap under
  ``gather`` (``kv_access.materialize``: the rank's send slots, then the all-gather),
  ``peer-read`` and ``peer-read-unique`` (``HistoryViews``: the history pages read from
  every owner's pool, then the current rows after them);
- ``write``: the current chunk's KV write: ``replicated`` (levels 0-1) and
  ``owner-filtered`` (levels 2-4) all-gather the chunk (``collect.gather_current``) and
  write every row or the owned rows; ``direct`` (level 5) writes the rank's own rows;
- ``current-gather``: the chunk's all-gather alone (what a level-5 peer-read keeps);
- ``tail``: the last-token hidden states, ``full`` gather (level 0) against ``narrow``;
- ``pd-pack``: the rank's owned pages of every request packed into a staging buffer
  (``pd.pack.pack_rows`` on ``pd_pack``'s rows as whole pages and the rest, pieces cut at
  the staging size);
- ``rollback-save``: the copy of the rows the batch will write (``PagedKVPool.save_rows``).

Bytes are the bytes each op writes (every one read once): a gather counts its send slots
and the gathered result, an index select its output, a write the rows it stores.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from cpkv.bench.rows.group import RankAlone
from cpkv.bench.rows.measure import sync
from cpkv.bench.rows.setup import RANK, PointSetup
from cpkv.plan.capacity import scratch_tokens
from cpkv_core.config import MaterializeMode
from cpkv_core.pd.pack import PackIndex, pack_index, pack_rows, row_views
from cpkv_core.pd.staging import STAGING_BUFFERS
from cpkv_core.pd.target import STAGING_BYTES
from cpkv_core.planning import ExecutionPlan, HostPlan, KvReadStrategy
from cpkv_core.planning.pd_pack import page_runs, sender_first_rows, token_rows
from cpkv_core.planning.pd_reshard import reshard_pieces
from cpkv_core.runtime import PagedKVPool, materialize
from cpkv_core.runtime.collect import (
    collect_full_gather,
    collect_narrow_last_token,
    gather_current,
)
from cpkv_core.runtime.history_views import HistoryViews
from cpkv_core.runtime.kv_access import MATERIALIZE_TAG, write_rows

__all__ = ["RowOp", "chunk_ops", "replicated_ops", "sharded_ops"]

POOL_SCRATCH = "kv-pool scratch (cpkv plan)"
RESERVE = "reserve (activations)"
PD_STAGING = f"pd staging ({STAGING_BUFFERS} x {STAGING_BYTES >> 20} MiB a process, static)"


@dataclass(frozen=True, slots=True)
class RowOp:
    """One op of one point, ready to run."""

    op: str
    variant: str
    levels: tuple[int, ...]
    """Levels whose batches run it (on a history batch)."""
    per: str
    """``layer`` or ``chunk``."""
    bytes: int
    run: Callable[[], object]
    planned_scratch_bytes: int | None
    """What ``cpkv plan`` budgets for its temporaries; None outside the plan's pool."""
    budget: str
    """Where its temporaries are budgeted."""
    first_run: Callable[[], object] | None = None
    """A call as the batch's first layer makes it (buffers allocated); ``run`` otherwise."""
    plan_seconds: Callable[[], float] | None = None
    """Host plan and device expansion of its strategy, once per batch (views only)."""


def _planned(setup: PointSetup, mode: MaterializeMode) -> int:
    tokens = scratch_tokens(setup.view_tokens, setup.point.cp_size, setup.deploy.page_size, mode)
    return tokens * setup.row_bytes


def _plan_timer(setup: PointSetup, strategies: ExecutionPlan, peer: bool) -> Callable[[], float]:
    def seconds() -> float:
        began = time.perf_counter()
        setup.tensors(setup.plan(strategies, peer_read=peer))
        sync(setup.device)
        return time.perf_counter() - began

    return seconds


def _gather_view(setup: PointSetup, remap: KvReadStrategy, comm: RankAlone) -> RowOp:
    strategies = ExecutionPlan(
        setup.level2_plan.split, setup.level2_plan.kv_write, remap, setup.level2_plan.output
    )
    host = setup.plan(strategies)
    send_pages = setup.tensors(host).send_pages
    layer = setup.shard(RANK).layers[0]
    cp, ps = setup.point.cp_size, setup.deploy.page_size
    return RowOp(
        op="view",
        variant="slot" if remap is KvReadStrategy.MATERIALIZED_SLOT else "unique",
        levels=(2, 3, 4, 5),
        per="layer",
        bytes=(1 + cp) * len(send_pages) * ps * setup.row_bytes,
        run=lambda: materialize(comm, layer, send_pages, ps),
        planned_scratch_bytes=_planned(setup, MaterializeMode.GATHER),
        budget=POOL_SCRATCH,
        plan_seconds=_plan_timer(setup, strategies, peer=False),
    )


def _peer_view(setup: PointSetup, remap: KvReadStrategy, comm: RankAlone) -> RowOp:
    strategies = ExecutionPlan(
        setup.level2_plan.split, setup.level2_plan.kv_write, remap, setup.level2_plan.output
    )
    host = setup.plan(strategies, peer_read=True)
    tensors = setup.tensors(host)
    current = setup.rows(host.num_tokens)
    peers = [shard.layers for shard in setup.shards]
    pool = setup.shard(RANK)

    def views() -> HistoryViews:
        return HistoryViews(comm, pool, host, tensors, peers, False, MATERIALIZE_TAG)

    reused: list[HistoryViews] = []

    def run() -> object:
        """Every layer after the batch's first reuses the buffer (``HistoryViews``)."""
        if not reused:
            reused.append(views())
        return reused[0].keys(0, current)

    return RowOp(
        op="view",
        variant="peer-read" if remap is KvReadStrategy.MATERIALIZED_SLOT else "peer-read-unique",
        levels=(2, 3, 4, 5),
        per="layer",
        bytes=(host.history_tokens + host.num_tokens) * setup.row_bytes,
        run=run,
        planned_scratch_bytes=_planned(setup, MaterializeMode.PEER_READ),
        budget=POOL_SCRATCH,
        first_run=lambda: views().keys(0, current),
        plan_seconds=_plan_timer(setup, strategies, peer=True),
    )


def _gather_rows(host: HostPlan) -> int:
    """Rows the current chunk's gather writes: the padded local rows (when padded), the
    gathered stack, the batch-order select."""
    padded = host.max_local if host.max_local > host.num_local else 0
    return padded + host.cp_size * host.max_local + host.num_tokens


def _write(
    setup: PointSetup,
    pool: PagedKVPool,
    strategies: ExecutionPlan,
    variant: str,
    levels: tuple[int, ...],
    comm: RankAlone,
) -> RowOp:
    host = setup.plan(strategies)
    tensors = setup.tensors(host)
    own = setup.rows(host.num_local)
    gathers = not host.write_from_local

    def run() -> None:
        source = gather_current(comm, own, host, tensors) if gathers else own
        write_rows(pool, 0, source, tensors.write_source, tensors.write_dest)

    gathered = _gather_rows(host) if gathers else 0
    return RowOp(
        op="write",
        variant=variant,
        levels=levels,
        per="layer",
        bytes=(gathered + host.num_written) * setup.row_bytes,
        run=run,
        planned_scratch_bytes=None,
        budget=RESERVE,
    )


def _current_gather(setup: PointSetup, comm: RankAlone) -> RowOp:
    host = setup.plan(setup.direct_plan)
    tensors = setup.tensors(host)
    own = setup.rows(host.num_local)
    return RowOp(
        op="current-gather",
        variant="all-gather",
        # NOTE: levels 0-4 run it inside their write; alone, level 5 under peer-read.
        levels=(),
        per="layer",
        bytes=_gather_rows(host) * setup.row_bytes,
        run=lambda: gather_current(comm, own, host, tensors),
        planned_scratch_bytes=None,
        budget=RESERVE,
    )


def _save(
    setup: PointSetup,
    pool: PagedKVPool,
    strategies: ExecutionPlan,
    variant: str,
    levels: tuple[int, ...],
) -> RowOp:
    tensors = setup.tensors(setup.plan(strategies))
    dest = tensors.write_dest
    return RowOp(
        op="rollback-save",
        variant=variant,
        levels=levels,
        per="layer",
        bytes=len(dest) * setup.row_bytes,
        run=lambda: pool.save_rows(dest),
        planned_scratch_bytes=None,
        budget=RESERVE,
    )


def _pd_pack(setup: PointSetup, num_layers: int) -> RowOp:
    """Every request's pages rank 0 owns, cut into pieces as the sender cuts them (a piece
    holds every layer and fits the staging buffer); one layer's rows of each piece."""
    cp, ps = setup.point.cp_size, setup.deploy.page_size
    pool = setup.shard(RANK)
    views = row_views(pool)
    staging = torch.empty(STAGING_BYTES, dtype=torch.uint8)
    pieces: list[PackIndex] = []
    for req in setup.batch.requests:
        table = np.asarray(req.page_table, dtype=np.int64)
        first_rows = sender_first_rows(table, ps, cp, sharded=True)
        token_bytes = setup.row_bytes * num_layers
        owned, _ = reshard_pieces(
            table, 0, len(table), req.seq_len, ps, cp, RANK, 1, token_bytes, (0,), STAGING_BYTES
        )
        for piece in owned:
            rows = token_rows(first_rows, piece.positions, req.seq_len, ps)
            pieces.append(pack_index(page_runs(rows, ps), setup.device))

    def run() -> None:
        for runs in pieces:
            pack_rows(views, runs, staging[: len(runs) * setup.row_bytes])

    return RowOp(
        op="pd-pack",
        variant="owned-pages",
        levels=(0, 1, 2, 3, 4, 5),
        per="layer",
        bytes=sum(len(runs) for runs in pieces) * setup.row_bytes,
        run=run,
        planned_scratch_bytes=None,
        budget=PD_STAGING,
    )


def sharded_ops(setup: PointSetup, comm: RankAlone, num_layers: int) -> Iterator[RowOp]:
    """The ops on the shards (levels 2-5, and PD), one at a time so each can be freed; the
    peer-read views last, since they alone need every owner's shard."""
    for remap in (KvReadStrategy.MATERIALIZED_SLOT, KvReadStrategy.MATERIALIZED_UNIQUE):
        yield _gather_view(setup, remap, comm)
    if not setup.point.shared_prefix:
        pool = setup.shard(RANK)
        yield _write(setup, pool, setup.level2_plan, "owner-filtered", (2, 3, 4), comm)
        yield _write(setup, pool, setup.direct_plan, "direct", (5,), comm)
        yield _current_gather(setup, comm)
        yield _save(setup, pool, setup.level2_plan, "owner-filtered", (2, 3, 4))
        yield _save(setup, pool, setup.direct_plan, "direct", (5,))
        yield _pd_pack(setup, num_layers)
    for remap in (KvReadStrategy.MATERIALIZED_SLOT, KvReadStrategy.MATERIALIZED_UNIQUE):
        yield _peer_view(setup, remap, comm)


def replicated_ops(setup: PointSetup, comm: RankAlone) -> Iterator[RowOp]:
    """The ops on a replicated pool (levels 0-1)."""
    pool = setup.pool(None)
    yield _write(setup, pool, setup.level0_plan, "replicated", (0, 1), comm)
    yield _save(setup, pool, setup.level0_plan, "replicated", (0, 1))


def _narrow_rows(host: HostPlan) -> int:
    """Hidden rows the narrow tail writes: the rank's ``bs`` rows (its local last rows
    selected, or zeros; with some local, zeros and each local row selected and copied in),
    the gathered stack, the pick of each request's row."""
    mixed = 0 < host.num_local_last < host.bs
    return host.bs + (2 * host.num_local_last if mixed else 0) + host.cp_size * host.bs + host.bs


def _tail(
    setup: PointSetup, strategies: ExecutionPlan, variant: str, levels: tuple[int, ...]
) -> RowOp:
    host = setup.plan(strategies)
    tensors = setup.tensors(host)
    hidden = setup.hidden(host.num_local)
    comm = RankAlone(RANK, setup.point.cp_size)
    full = variant == "full"
    rows = _gather_rows(host) + host.bs if full else _narrow_rows(host)
    collect = collect_full_gather if full else collect_narrow_last_token
    return RowOp(
        op="tail",
        variant=variant,
        levels=levels,
        per="chunk",
        bytes=rows * setup.fmt.hidden_bytes,
        run=lambda: collect(comm, hidden, host, tensors),
        planned_scratch_bytes=None,
        budget=RESERVE,
    )


def chunk_ops(setup: PointSetup) -> Iterator[RowOp]:
    """The tail's two collectors (once a chunk)."""
    yield _tail(setup, setup.level0_plan, "full", (0,))
    yield _tail(setup, setup.level1_plan, "narrow", (1, 2, 3, 4, 5))
