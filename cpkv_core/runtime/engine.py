"""The CP prefill engine: one rank's execution of a scheduled batch under an ``ExecutionPlan``.

Per batch: the host plan (``planning.build_host_plan``, O(pages + requests)), one copy of
its tables to the device and their expansion there (``device_plan``), then the run step
(``run_step``): per layer local projections, all-gather of the current KV and index K (none
under the ``none`` split, where every rank computes every token), the KV write, the KV read
with top-k and sparse attention for local queries; then the tail collects hidden states and
every rank computes the last-token outputs. The run step reads
no device value on the host, so it runs on CPU, CUDA and ``meta`` alike.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from torch import Tensor

from cpkv_core.config import DeploymentConfig, MaterializeMode, ModelConfig
from cpkv_core.dist.comm import Communicator
from cpkv_core.planning import (
    ExecutionPlan,
    HostPlan,
    KeySource,
    KvLayout,
    ScheduledBatch,
    ScheduledRequest,
    build_host_plan,
    owner_of_page,
)
from cpkv_core.runtime.collect import COLLECTORS, all_gather_tokens, gather_current
from cpkv_core.runtime.debug_checks import DebugChecks
from cpkv_core.runtime.device_plan import BatchTensors, expand, upload
from cpkv_core.runtime.faults import Fault
from cpkv_core.runtime.history_views import HistoryViews
from cpkv_core.runtime.kv_access import MATERIALIZE_TAG, key_source, write_rows
from cpkv_core.runtime.kv_pool import KVRows, PagedKVPool, SavedRows
from cpkv_core.runtime.local_attention import attend_local
from cpkv_core.runtime.model import (
    ModelWeights,
    embed,
    finish_layer,
    init_weights,
    lm_head,
    project,
)
from cpkv_core.runtime.outputs import RankBatchOutput, Served, StepOutput
from cpkv_core.runtime.shadow import ShadowPlan, run_shadowed
from cpkv_core.runtime.shared_pools import SharedPools, open_shared_pools


class CPEngine:
    """One CP rank: its KV pool and the plan executor; it allocates nothing.

    Pages come from the scheduler's ``ScheduledBatch``. The pool layout (replicated or
    sharded) is fixed at construction; every plan must agree with it.
    """

    def __init__(
        self,
        cfg: ModelConfig,
        deploy: DeploymentConfig,
        comm: Communicator,
        num_pages: int,
        kv_layout: KvLayout = KvLayout.REPLICATED,
        weights: ModelWeights | None = None,
        debug_checks: bool = False,
        device: torch.device | str = "cpu",
        fault: Fault | None = None,
    ) -> None:
        """Args:
        num_pages: logical pages of the KV address space (a multiple of cp_size is
            best: each owner gets ``ceil(num_pages / cp_size)`` of them).
        kv_layout: replicated (every page on every rank) or sharded (owned pages only).
        debug_checks: run the invariant checks of ``debug_checks``; they synchronise.
        device: where weights, the pool and every run-step tensor live.
        fault: a game-day fault injected into every path that uses its strategy.
        """
        if comm.world_size != deploy.cp_size:
            raise ValueError(
                f"process group has {comm.world_size} ranks but cp_size is {deploy.cp_size}"
            )
        self.cfg = cfg
        self.deploy = deploy
        self.comm = comm
        self.kv_layout = kv_layout
        self.device = torch.device(device)
        self.weights = weights if weights is not None else init_weights(cfg, self.device)
        pool_pages = (
            num_pages if kv_layout is KvLayout.REPLICATED else -(-num_pages // deploy.cp_size)
        )
        self.peers: SharedPools | None = None
        """Every rank's pool as this rank maps it (peer-read on a sharded layout)."""
        if deploy.materialize is MaterializeMode.PEER_READ:
            # NOTE: every level checks the one-host contract, so a replicated level 0
            # refuses a deployment that peer-read could not serve later.
            shared = open_shared_pools(
                comm, cfg, pool_pages, deploy.page_size, deploy.index_k_dtype, self.device
            )
            self.peers = shared if kv_layout is KvLayout.SHARDED else None
            self.pool = shared.pool
        else:
            self.pool = PagedKVPool(
                cfg, pool_pages, deploy.page_size, deploy.index_k_dtype, self.device
            )
        self.debug = DebugChecks(self) if debug_checks else None
        self.fault: Fault | None = fault
        self.requests: dict[str, ScheduledRequest] = {}
        """The latest chunk of every request this rank ran (PD reads its page table)."""
        self.stored_pages = 0
        """Pages in use that this rank's pool stores."""
        self.exposed_materialize_seconds = 0.0
        """Host time of the current batch's view reads that no compute overlapped."""

    def host_plan(self, batch: ScheduledBatch, plan: ExecutionPlan) -> HostPlan:
        """The host half of a batch on this rank."""
        if plan.kv_layout is not self.kv_layout:
            raise RuntimeError(
                f"batch {batch.batch}: plan writes a {plan.kv_layout} layout into a "
                f"{self.kv_layout} pool, indicates a bug in the gate (KV at rest cannot change)"
            )
        return build_host_plan(
            batch,
            plan,
            self.comm.rank,
            peer_read=self.peers is not None,
            history_view=self.deploy.materialize_prefetch,
        )

    def run_batch(
        self,
        batch: ScheduledBatch,
        plan: ExecutionPlan,
        shadow: ShadowPlan | None = None,
    ) -> RankBatchOutput:
        """Runs one batch on this rank; every rank of the group must call it together.

        ``shadow`` (a sampled batch) replaces the single run: the candidate and fallback
        paths are run and compared, and the surviving one is served (``runtime.shadow``).

        All or nothing: if any part raises (the debug checks included), this rank's pool rows
        the batch wrote are restored and nothing is committed (``requests``,
        ``stored_pages``); the caller rolls the scheduler back (``Scheduler.rollback``) and
        may run the batch again.
        """
        start = time.perf_counter()
        before = self._gathered_bytes()
        self.exposed_materialize_seconds = 0.0
        if self.peers is not None:
            self.peers.batch_start()
        if shadow is None:
            served, saved = self.run_plan(batch, plan)
        else:
            served, saved = run_shadowed(self, batch, shadow)
        if self.debug is not None:
            try:
                self.debug.after_batch(batch, served.tensors)
            except BaseException:
                self.pool.restore_rows(saved)
                raise
        self._commit(batch)
        after = self._gathered_bytes()
        return RankBatchOutput(
            batch=batch.batch,
            rank=self.comm.rank,
            local_token_indices=served.tensors.local_token_indices,
            topk=served.step.topk,
            last_hidden=served.step.last_hidden,
            logits=served.step.logits,
            gathered_bytes={tag: after[tag] - before.get(tag, 0) for tag in after},
            kv_bytes=self.pool.bytes_for_pages(self.stored_pages),
            seconds=time.perf_counter() - start,
            shadow=served.shadow,
            exposed_materialize_seconds=self.exposed_materialize_seconds,
        )

    def prepare(self, batch: ScheduledBatch, plan: ExecutionPlan) -> tuple[HostPlan, BatchTensors]:
        """The host plan and its expanded tensors, with the injected fault (if any) applied
        to the paths it targets."""
        host = self.host_plan(batch, plan)
        tensors = expand(host, upload(host, self.device), self.cfg.vocab_size)
        if self.fault is not None:
            tensors = self.fault.apply(host, tensors)
        return host, tensors

    def run_plan(self, batch: ScheduledBatch, plan: ExecutionPlan) -> tuple[Served, SavedRows]:
        """Plans and runs one path of a batch (no commit), all or nothing for the pool.

        The rows the batch is about to write (``write_dest``, known from the host plan) are
        saved first, with device ops only; if the run raises (a failed layer, a peer that
        died or stalled in a collective), they are written back before the error goes on,
        so the pool is as it was before the batch. A run that succeeds only pays the copy,
        and returns it so that a failure before the commit can still undo the batch.
        """
        host, tensors = self.prepare(batch, plan)
        saved = self.pool.save_rows(tensors.write_dest)
        try:
            step = self.run_step(host, tensors, batch)
            if plan.computes_every_token and self.comm.world_size > 1:
                # NOTE: an unsplit batch has no collective after its writes (no tail gather):
                # without this, a rank would commit while a peer failed the batch.
                self.comm.barrier()
            return Served(host, tensors, step), saved
        except BaseException:
            self.pool.restore_rows(saved)
            raise

    def run_step(
        self,
        host: HostPlan,
        tensors: BatchTensors,
        batch: ScheduledBatch | None = None,
        reads: list[KVRows] | None = None,
    ) -> StepOutput:
        """The device half: every layer, then the tail. ``batch`` is read by the debug
        checks only; ``reads`` (shadow comparisons) collects each layer's key rows read."""
        hidden = embed(self.weights, tensors.local_token_ids, tensors.local_positions)
        views = None
        if host.key_source is KeySource.HISTORY_AND_CURRENT:
            peers = self.peers.peers if self.peers is not None else ()
            prefetch = self.deploy.materialize_prefetch
            views = HistoryViews(
                self.comm, self.pool, host, tensors, peers, prefetch, MATERIALIZE_TAG
            )
            if prefetch:
                views.start(0)
        topk_per_layer = []
        needs_current = host.gathers_current
        for layer_index, layer in enumerate(self.weights.layers):
            proj = project(self.cfg, layer, hidden, self.deploy.index_k_dtype)
            own = KVRows(proj.latent, proj.index_k, proj.index_k_scale)
            # NOTE: without a gather the write and the read use ``own``: a direct write's
            # rows, or under the none split the whole chunk in batch order.
            current = gather_current(self.comm, own, host, tensors) if needs_current else own
            source = own if host.write_from_local else current
            write_rows(self.pool, layer_index, source, tensors.write_source, tensors.write_dest)
            keys = self._keys(layer_index, host, tensors, current, views)
            if reads is not None:
                reads.append(keys.select(tensors.key_rows))
            if self.debug is not None and batch is not None:
                self.debug.check_layer(batch, host, tensors, keys, layer_index)
            attn, topk = attend_local(self.cfg, proj, host, tensors, keys)
            topk_per_layer.append(topk)
            hidden = finish_layer(layer, hidden, attn)
        if views is not None:
            self.exposed_materialize_seconds += views.exposed_seconds
        last_hidden = COLLECTORS[host.strategies.output](self.comm, hidden, host, tensors)
        normed, logits = lm_head(self.weights, last_hidden)
        return StepOutput(torch.stack(topk_per_layer), normed, logits)

    def _keys(
        self,
        layer: int,
        host: HostPlan,
        tensors: BatchTensors,
        current: KVRows,
        views: HistoryViews | None,
    ) -> KVRows:
        """The key buffer of ``layer``; a gathered view's time counts as exposed."""
        if views is not None:
            return views.keys(layer, current)
        if host.key_source is not KeySource.VIEW:
            return key_source(
                self.comm, self.pool, layer, host.key_source, tensors.send_rows, current
            )
        began = time.perf_counter()
        keys = key_source(self.comm, self.pool, layer, host.key_source, tensors.send_rows, current)
        self.exposed_materialize_seconds += time.perf_counter() - began
        return keys

    def _commit(self, batch: ScheduledBatch) -> None:
        self.requests.update((r.rid, r) for r in batch.requests)
        new_pages = batch.new_pages
        if self.kv_layout is KvLayout.SHARDED:
            new_pages = new_pages[owner_of_page(new_pages, self.deploy.cp_size) == self.comm.rank]
        self.stored_pages += int(np.size(new_pages))

    def close(self) -> None:
        """Unmaps the peers' pools before any owner frees its own; every rank of the group
        calls it together at the end of a run. Without it a CUDA IPC owner can exit while a
        peer still maps its arena (torch warns that the producer terminated first)."""
        if self.peers is None:
            return
        self.peers = None
        self.comm.barrier()
        if self.device.type == "cuda":
            torch.cuda.ipc_collect()  # type: ignore[no-untyped-call]  # NOTE: what peers let go

    def forget(self, rid: str) -> None:
        """Drops ``rid`` once its KV left this rank (PD, after the decode side's ack)."""
        del self.requests[rid]

    def _gathered_bytes(self) -> dict[str, int]:
        return {tag: s.bytes_gathered for tag, s in self.comm.stats.by_tag.items()}

    def all_gather_tokens(
        self, local: Tensor, host: HostPlan, tensors: BatchTensors, tag: str
    ) -> Tensor:
        """``collect.all_gather_tokens`` on this rank's group (``[num_tokens, ...]``)."""
        return all_gather_tokens(self.comm, local, host, tensors, tag)
