"""Runtime invariant checks for sharded KV (``SGLANG_DEBUG_CP_SHARED_KV``).

They read tensor values and call collectives, so they synchronise: off by default and
never on in a benchmark. Each check raises RuntimeError naming the broken invariant; the
engine's entry points (``check_layer`` inside the step, ``after_batch`` after it) record
it in ``failures`` with the decision points it implicates instead, and go on, so that every
rank still runs every check's collective; the batch then fails at its commit vote
(``runtime.failures``). What a batch adds to the checks' record is kept only once it
commits (``commit``).

- ``check_writes_owned``: a sharded rank writes only token rows of pages it owns.
- ``check_written``: every current token's row in its owner's pool equals the row the
  batch computed for it.
- ``check_view``: every key row a batch reads (history included, whatever the key source:
  own pool, materialized view or reused current chunk) equals the row its owner's pool
  holds for that logical loc after the write.
- ``check_peer_view``: under peer-read, the history view read from the owners' mapped
  pools equals the view the gather path builds from the gathered pools, row for row.
- ``after_batch``: per written token row, the shards partition the token rows in use
  (sharded: each written by its owner only; replicated: by every rank).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np
import numpy.typing as npt
import torch

from cpkv_core.config import DeploymentConfig
from cpkv_core.dist.comm import Communicator
from cpkv_core.dist.value_collectives import gather_value
from cpkv_core.planning import (
    DecisionPoint,
    HostPlan,
    KvLayout,
    ScheduledBatch,
    owner_of_loc,
    physical_loc,
)
from cpkv_core.runtime.device_plan import BatchTensors
from cpkv_core.runtime.failures import FailureCause, LocalFailure
from cpkv_core.runtime.kv_pool import KVRows, PagedKVPool, page_rows

DEBUG_TAG = "debug"
"""Collective tag of the checks' gathers, so their bytes are counted apart."""

IntArray = npt.NDArray[np.int64]

_WRITE = frozenset({DecisionPoint.KV_WRITE})
_READ = frozenset({DecisionPoint.KV_READ})


def _same_rows(a: KVRows, b: KVRows) -> npt.NDArray[np.bool_]:
    """Per row: latent, index K (bytes) and scale equal. ``[n]`` bool, on the host."""
    latent = (a.latent == b.latent).all(dim=1)
    index_k = (a.index_k.view(torch.uint8) == b.index_k.view(torch.uint8)).all(dim=1)
    return (latent & index_k & (a.index_k_scale == b.index_k_scale)).cpu().numpy()


def request_locs(batch: ScheduledBatch, index: int, start: int, end: int) -> IntArray:
    """Logical locs of positions ``[start, end)`` of request ``index`` of ``batch``."""
    ps = batch.page_size
    positions = np.arange(start, end, dtype=np.int64)
    table = np.asarray(batch.requests[index].page_table, np.int64)
    locs: IntArray = table[positions // ps] * ps + positions % ps
    return locs


class CheckedEngine(Protocol):
    """What the checks read of the engine they guard (``CPEngine``)."""

    @property
    def deploy(self) -> DeploymentConfig: ...

    @property
    def comm(self) -> Communicator: ...

    @property
    def pool(self) -> PagedKVPool: ...

    @property
    def kv_layout(self) -> KvLayout: ...


class DebugChecks:
    """The checks of one engine, with the host-side record they need."""

    def __init__(self, engine: CheckedEngine) -> None:
        self.engine = engine
        self.written_locs: set[int] = set()
        """Logical token rows this rank has stored KV for."""
        self.locs_in_use: set[int] = set()
        """Logical token rows of every request this rank has run, history included."""
        self.failures: list[LocalFailure] = []
        """The checks that fired in the batch being run (the engine resets it per batch)."""
        self._pending: tuple[set[int], set[int]] | None = None

    def _record(self, points: frozenset[DecisionPoint], check: Callable[[], None]) -> None:
        """Runs ``check``; when it fires, records it as implicating ``points``."""
        try:
            check()
        except RuntimeError as exc:
            self.failures.append(LocalFailure(FailureCause.DEBUG_CHECK, points, str(exc)))

    @property
    def written_pages(self) -> set[int]:
        """Logical pages this rank has stored KV for."""
        page_size = self.engine.deploy.page_size
        return {loc // page_size for loc in self.written_locs}

    def check_layer(
        self,
        batch: ScheduledBatch,
        host: HostPlan,
        tensors: BatchTensors,
        keys: KVRows,
        layer: int,
        chunk: KVRows,
    ) -> None:
        """The per-layer checks, after the write and before attention, each recorded when
        it fires. ``chunk`` is the current chunk in batch order (the step's gathered rows, or
        under the ``none`` split its own). Once the written rows are right, a view that
        differs from the pools is a bad read."""
        failed = len(self.failures)
        self._record(_WRITE, lambda: self.check_writes_owned(tensors))
        pools = self._gathered_pools(layer)
        self._record(_WRITE, lambda: self.check_written(batch, chunk, layer, pools))
        if len(self.failures) > failed:
            return  # NOTE: the views of a bad write differ too; the write is to blame
        self._record(_READ, lambda: self.check_peer_view(host, tensors, keys, layer, pools))
        self._record(_READ, lambda: self.check_view(batch, host, tensors, keys, layer, pools))

    def check_written(
        self, batch: ScheduledBatch, chunk: KVRows, layer: int, pools: KVRows
    ) -> None:
        """Every current token's row in its owner's pool equals the row the batch computed
        for it (``chunk [num_tokens, ...]``, batch order)."""
        engine = self.engine
        rank, cp_size, page_size = engine.comm.rank, engine.deploy.cp_size, engine.deploy.page_size
        locs = np.concatenate(
            [
                request_locs(batch, i, req.prefix_len, req.seq_len)
                for i, req in enumerate(batch.requests)
            ]
        )
        sharded = engine.kv_layout is KvLayout.SHARDED
        rows = physical_loc(locs, page_size, cp_size) if sharded else locs
        owners = owner_of_loc(locs, page_size, cp_size)
        truth = torch.from_numpy(owners * len(engine.pool.layers[layer]) + rows)
        same = _same_rows(chunk, pools.select(truth.to(chunk.latent.device)))
        if not same.all():
            bad = locs[~same][:8].tolist()
            raise RuntimeError(
                f"rank {rank} layer {layer}: {int((~same).sum())} rows the batch computed "
                f"differ from their owners' pools after the write, logical locs {bad}"
            )

    def _gathered_pools(self, layer: int) -> KVRows:
        """Every rank's pool layer, gathered (a collective: every rank calls it)."""
        engine = self.engine
        pool = engine.pool.layers[layer]
        return KVRows(
            engine.comm.all_gather(pool.latent, DEBUG_TAG).flatten(0, 1),
            engine.comm.all_gather(pool.index_k, DEBUG_TAG).flatten(0, 1),
            engine.comm.all_gather(pool.index_k_scale, DEBUG_TAG).flatten(0, 1),
        )

    def check_peer_view(
        self, host: HostPlan, tensors: BatchTensors, keys: KVRows, layer: int, pools: KVRows
    ) -> None:
        """Peer-read: the history view equals the gathered pools' rows of the same pages."""
        view = host.peer_view
        if view is None or view.view_tokens == 0:
            return
        engine = self.engine
        rows_per_rank = len(engine.pool.layers[layer])
        bounds = np.asarray(view.owner_rows, np.int64)
        owner = np.repeat(np.arange(view.cp_size, dtype=np.int64), np.diff(bounds))
        send_rows = page_rows(tensors.send_pages, view.page_size)
        offsets = torch.from_numpy(owner * rows_per_rank).to(send_rows.device)
        # NOTE: only rows some key reads: the rest of a page the chunk resumes in is
        # written by its owner during this batch, so a view may hold it before or after.
        key_rows = tensors.key_rows.cpu().numpy()
        used = np.unique(key_rows[key_rows < view.view_tokens])
        index = torch.from_numpy(used).to(offsets.device)
        gathered = pools.select((send_rows + offsets).index_select(0, index))
        same = _same_rows(keys.select(index), gathered)
        if not same.all():
            bad = used[~same][:8].tolist()
            raise RuntimeError(
                f"rank {engine.comm.rank} layer {layer}: the peer-read history view differs "
                f"from the gathered view in {int((~same).sum())} rows, view rows {bad} "
                "(a peer's pool is not mapped where its owner writes)"
            )

    def check_writes_owned(self, tensors: BatchTensors) -> None:
        """Sharded: every token row this rank wrote is on a page it owns."""
        engine = self.engine
        if engine.kv_layout is not KvLayout.SHARDED:
            return
        rank, cp_size, page_size = engine.comm.rank, engine.deploy.cp_size, engine.deploy.page_size
        owners = owner_of_loc(tensors.written_locs.cpu().numpy(), page_size, cp_size)
        if not bool((owners == rank).all()):
            raise RuntimeError(
                f"rank {rank} wrote a page it does not own: owners {owners.tolist()}"
            )

    def check_view(
        self,
        batch: ScheduledBatch,
        host: HostPlan,
        tensors: BatchTensors,
        keys: KVRows,
        layer: int,
        pools: KVRows,
    ) -> None:
        """Every key row this rank reads equals its owner's pool row for that logical loc.

        Every rank's pool layer is gathered (pools are the same size on every rank), so the
        row of logical loc ``l`` is ``pools[owner(l), row(l)]``: ``physical_loc`` sharded,
        ``l`` replicated (which also checks that replicas agree).
        """
        engine = self.engine
        rank, cp_size, page_size = engine.comm.rank, engine.deploy.cp_size, engine.deploy.page_size
        pool = engine.pool.layers[layer]
        if not host.attended:
            return
        locs = np.concatenate(
            [
                request_locs(batch, req.index, 0, req.key_end - req.key_start)
                for req in host.attended
            ]
        )
        owners = owner_of_loc(locs, page_size, cp_size)
        sharded = engine.kv_layout is KvLayout.SHARDED
        rows = physical_loc(locs, page_size, cp_size) if sharded else locs
        truth = torch.from_numpy(owners * len(pool) + rows).to(pool.latent.device)
        same = _same_rows(keys.select(tensors.key_rows), pools.select(truth))
        if not same.all():
            bad = locs[~same][:8].tolist()
            raise RuntimeError(
                f"rank {rank} layer {layer}: {int((~same).sum())} key rows read "
                f"({host.key_source}) differ from their owners' pools, logical locs {bad}"
            )

    def after_batch(self, batch: ScheduledBatch, tensors: BatchTensors) -> None:
        """Checks that the shards partition the token rows in use with the batch's rows
        added (recorded when it fires); ``commit`` keeps them once the batch commits."""
        written = self.written_locs | set(tensors.written_locs.cpu().tolist())
        in_use = set(self.locs_in_use)
        for i, req in enumerate(batch.requests):
            in_use.update(request_locs(batch, i, 0, req.seq_len).tolist())
        self._pending = (written, in_use)
        self._record(_WRITE, lambda: self.check_coverage(written, in_use))

    def commit(self) -> None:
        """Keeps the token rows of the batch ``after_batch`` checked (it committed)."""
        if self._pending is not None:
            self.written_locs, self.locs_in_use = self._pending
            self._pending = None

    def check_coverage(
        self, written_locs: set[int] | None = None, in_use: set[int] | None = None
    ) -> None:
        """Every token row in use was stored by its owner only (sharded) or by every rank
        (replicated), and by no other rank (by default, of the batches committed so far)."""
        engine = self.engine
        mine = self.written_locs if written_locs is None else written_locs
        in_use = self.locs_in_use if in_use is None else in_use
        written = gather_value(engine.comm, sorted(mine), list[int], "token rows")
        if written is None:
            return
        sets = [set(locs) for locs in written]
        if engine.kv_layout is KvLayout.REPLICATED:
            bad = [rank for rank, locs in enumerate(sets) if locs != in_use]
            if bad:
                raise RuntimeError(f"replicated pools of ranks {bad} miss token rows in use")
            return
        cp_size, page_size = engine.deploy.cp_size, engine.deploy.page_size
        for rank, locs in enumerate(sets):
            foreign = sorted(loc for loc in locs if owner_of_loc(loc, page_size, cp_size) != rank)
            if foreign:
                raise RuntimeError(f"rank {rank} stored token rows it does not own: {foreign[:8]}")
        union = set().union(*sets)
        if union != in_use:
            raise RuntimeError(
                f"shards do not cover the token rows in use: missing {sorted(in_use - union)[:8]}"
            )
