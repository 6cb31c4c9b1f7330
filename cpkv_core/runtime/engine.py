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

from cpkv_core.config import DeploymentConfig, ModelConfig
from cpkv_core.dist.comm import Communicator
from cpkv_core.planning import (
    DecisionPoint,
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
from cpkv_core.runtime.debug_checks import DEBUG_TAG, DebugChecks
from cpkv_core.runtime.device_plan import BatchTensors, expand, upload
from cpkv_core.runtime.faults import Fault
from cpkv_core.runtime.history_views import HistoryViews
from cpkv_core.runtime.kv_access import key_source, write_rows
from cpkv_core.runtime.kv_pool import KVRows, PagedKVPool, SavedRows
from cpkv_core.runtime.local_attention import attend_local
from cpkv_core.runtime.model import (
    embed,
    finish_layer,
    lm_head,
    project,
)
from cpkv_core.runtime.outputs import RankBatchOutput, Served, StepOutput
from cpkv_core.runtime.shadow import ShadowPlan
from cpkv_core.runtime.shared_pools import SharedPools, rank_pool
from cpkv_core.runtime.step_guard import StepGuard, run_agreed
from cpkv_core.runtime.weights import LayerWeights, ModelWeights, init_weights


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
        self.pool: PagedKVPool
        self.peers: SharedPools | None
        """Every rank's pool as this rank maps it (peer-read on a sharded layout)."""
        self.pool, self.peers = rank_pool(comm, cfg, deploy, num_pages, kv_layout, self.device)
        self.debug = DebugChecks(self) if debug_checks else None
        self.fault: Fault | None = fault
        self.requests: dict[str, ScheduledRequest] = {}
        """The latest chunk of every request this rank ran (PD reads its page table)."""
        self.stored_pages = 0
        """Pages in use that this rank's pool stores."""
        self.exposed_materialize_seconds = 0.0
        """Host time of the current batch's view reads that no compute overlapped."""
        self.guard = StepGuard()
        """The failures of the batch ``run_batch`` is running (idle between batches)."""

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

        All or nothing, agreed by every rank (``runtime.failures``): the group votes once
        the host half is built, before the step's first collective, and again before the
        commit, after the debug and non-finite checks. A failure any rank recorded makes
        every rank raise ``BatchFailed`` with the same verdict, its pool rows restored and
        nothing committed (``requests``, ``stored_pages``); any other exception restores the
        rows too and goes on. The caller rolls the scheduler back and may run the batch again.
        """
        start = time.perf_counter()
        before = self._gathered_bytes()
        self.exposed_materialize_seconds = 0.0
        if self.peers is not None:
            self.peers.batch_start()
        served, _ = run_agreed(self, batch, plan, shadow)
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
            tensors = self.fault.apply(host, tensors, batch.batch)
        return host, tensors

    def run_plan(self, batch: ScheduledBatch, plan: ExecutionPlan) -> tuple[Served, SavedRows]:
        """Plans and runs one path of a batch (no commit), all or nothing for the pool.

        The rows the batch is about to write (``write_dest``, known from the host plan) are
        saved first, with device ops only; if the run raises (a failed layer, a peer that
        died or stalled in a collective), they are written back before the error goes on,
        so the pool is as it was before the batch. A run that succeeds only pays the copy,
        and returns it so that a failure before the commit can still undo the batch.
        """
        return self.run_prepared(batch, *self.prepare(batch, plan))

    def run_prepared(
        self, batch: ScheduledBatch, host: HostPlan, tensors: BatchTensors
    ) -> tuple[Served, SavedRows]:
        """``run_plan`` with its host half built already."""
        saved = self.pool.save_rows(tensors.write_dest)
        try:
            return Served(host, tensors, self.run_step(host, tensors, batch)), saved
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
        checks and the game-day fault only; ``reads`` (shadow comparisons) collects each
        layer's key rows read. Inside ``run_batch``, an exception in a collective-free op
        is recorded for the batch's vote, not raised (``step_guard``)."""
        hidden = embed(self.weights, tensors.local_token_ids, tensors.local_positions)
        peers = self.peers.peers if self.peers is not None else ()
        views = HistoryViews.open(
            self.comm, self.pool, host, tensors, peers, self.deploy.materialize_prefetch
        )
        topk_per_layer = []
        for index, layer in enumerate(self.weights.layers):
            hidden, topk = self._layer(index, layer, hidden, host, tensors, views, batch, reads)
            topk_per_layer.append(topk)
        if views is not None:
            self.exposed_materialize_seconds += views.exposed_seconds
        self.guard.note_tail_input(hidden)
        last_hidden = COLLECTORS[host.strategies.output](self.comm, hidden, host, tensors)
        with self.guard.region(DecisionPoint.OUTPUT):
            # NOTE: after the tail's gather the step calls no collective.
            last_hidden = self.guard.through(DecisionPoint.OUTPUT, host, last_hidden, True)
        normed, logits = lm_head(self.weights, last_hidden)
        if not self.guard.active and self.debug is not None and self.debug.failures:
            raise RuntimeError(self.debug.failures[0].message)
        return StepOutput(torch.stack(topk_per_layer), normed, logits)

    def _layer(
        self,
        index: int,
        layer: LayerWeights,
        hidden: Tensor,
        host: HostPlan,
        tensors: BatchTensors,
        views: HistoryViews | None,
        batch: ScheduledBatch | None,
        reads: list[KVRows] | None,
    ) -> tuple[Tensor, Tensor]:
        """One layer: projections, the current chunk's gather, the write, the read, the
        checks and the attention. Returns the hidden states and the layer's top-k."""
        proj = project(self.cfg, layer, hidden, self.deploy.index_k_dtype)
        own = KVRows(proj.latent, proj.index_k, proj.index_k_scale)
        # NOTE: without a gather the write and the read use ``own``: a direct write's
        # rows, or under the none split the whole chunk in batch order.
        current = gather_current(self.comm, own, host, tensors) if host.gathers_current else own
        source = own if host.write_from_local else current
        last = index == len(self.weights.layers) - 1
        with self.guard.region(DecisionPoint.KV_WRITE):
            source = self.guard.through(DecisionPoint.KV_WRITE, host, source, last)
            write_rows(self.pool, index, source, tensors.write_source, tensors.write_dest)
        keys = self._keys(index, host, tensors, current, views)
        if host.key_source in (KeySource.POOL, KeySource.CURRENT):
            with self.guard.region(DecisionPoint.KV_READ):
                keys = self.guard.through(DecisionPoint.KV_READ, host, keys, last)
        if reads is not None:
            reads.append(keys.select(tensors.key_rows))
        if self.debug is not None and batch is not None:
            chunk = current
            if not (host.gathers_current or host.strategies.computes_every_token):
                chunk = gather_current(self.comm, own, host, tensors, DEBUG_TAG)
            self.debug.check_layer(batch, host, tensors, keys, index, chunk)
        attn, topk = attend_local(self.cfg, proj, host, tensors, keys)
        return finish_layer(layer, hidden, attn), topk

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
        began = time.perf_counter()
        keys = key_source(self.comm, self.pool, layer, host.key_source, tensors.send_pages, current)
        if host.key_source is KeySource.VIEW:
            self.exposed_materialize_seconds += time.perf_counter() - began
        return keys

    def _commit(self, batch: ScheduledBatch) -> None:
        if self.debug is not None:
            self.debug.commit()
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
