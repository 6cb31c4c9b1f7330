"""Host-side figures of ``cpkv bench``, and phase 1's tail: the gate's decision time, one
rank's host plan time over long histories, and the tail bytes gathered per rank."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

from cpkv.bench.measure import ALL_PHASES, median_seconds, synthetic_batch
from cpkv.run.jobs import Backend, RankJob
from cpkv.run.loop import HostLoop
from cpkv.run.runner import run_levels
from cpkv_core.config import CpMode, DeploymentConfig, ModelConfig
from cpkv_core.planning import BatchSpec, RequestSpec, build_host_plan, pages_for_trace
from phases import PhaseId

HOST_PLAN_PAGE_SIZE = 64
"""The host-plan figure's page size (NSA models' page), whatever the bench's own."""


@dataclass(frozen=True, slots=True)
class GateTiming:
    """Gate decision time for one batch size."""

    bs: int
    microseconds_per_batch: float


def bench_gate(deploy: DeploymentConfig, sizes: Sequence[int] = (1, 32, 256)) -> list[GateTiming]:
    """Time of ``Gate.decide`` per scheduled batch, every registered phase enabled."""
    rows = []
    for bs in sizes:
        batch = synthetic_batch(bs, extend_len=4 * deploy.page_size * deploy.cp_size)
        loop = HostLoop(
            deploy, ALL_PHASES, pages_for_trace([batch], deploy.page_size, deploy.cp_size)
        )
        scheduled = loop.step(batch).scheduled
        repeats = max(20, 20_000 // bs)
        seconds = median_seconds(partial(loop.gate.decide, scheduled), repeats=repeats)
        rows.append(GateTiming(bs, seconds * 1e6))
    return rows


@dataclass(frozen=True, slots=True)
class HostPlanTiming:
    """Host planning time of one rank for one batch with long histories."""

    requests: int
    history_tokens: int
    """History per request before the measured batch."""
    extend_tokens: int
    pages: int
    """Page-table entries the batch reads (every request's whole table)."""
    phase: int
    microseconds: float
    """``build_host_plan`` for rank 0, median after a warm-up."""

    @property
    def microseconds_per_page(self) -> float:
        """Host plan time over page-table entries: flat as history grows when O(pages)."""
        return self.microseconds / self.pages


def bench_host_plan(
    deploy: DeploymentConfig,
    histories: Sequence[int] = (4096, 32768, 131072),
    requests: int = 8,
    repeats: int = 20,
) -> list[HostPlanTiming]:
    """``build_host_plan`` of a batch of ``requests`` continuing requests, each with
    ``history`` tokens already cached, at page 64 and ``deploy``'s CP size, every phase
    enabled (the gate picks the plan)."""
    deploy = deploy.model_copy(update={"page_size": HOST_PLAN_PAGE_SIZE})
    extend = 2 * deploy.cp_size * deploy.page_size
    rows = []
    for history in histories:
        first = BatchSpec(0, tuple(RequestSpec(f"r{i}", 0, history) for i in range(requests)))
        second = BatchSpec(1, tuple(RequestSpec(f"r{i}", history, extend) for i in range(requests)))
        pages = pages_for_trace([first, second], deploy.page_size, deploy.cp_size)
        loop = HostLoop(deploy, ALL_PHASES, pages)
        loop.step(first)
        step = loop.step(second)
        plan = partial(build_host_plan, step.scheduled, step.decision.plan, 0)
        seconds = median_seconds(plan, repeats=repeats)
        entries = sum(len(r.page_table) for r in step.scheduled.requests)
        rows.append(
            HostPlanTiming(requests, history, extend, entries, step.decision.phase, seconds * 1e6)
        )
    return rows


@dataclass(frozen=True, slots=True)
class TailBytes:
    """Tail bytes gathered per rank for one batch, full gather (level 0) vs narrow (level 1)."""

    cp_size: int
    cp_mode: str
    bs: int
    tokens: int
    full_gather_bytes: int
    narrow_bytes: int

    @property
    def ratio(self) -> float:
        """narrow / full."""
        return self.narrow_bytes / self.full_gather_bytes


def bench_tail_bytes(
    model: ModelConfig, cp_sizes: Sequence[int] = (2, 4, 8), bs: int = 8, extend_len: int = 96
) -> list[TailBytes]:
    """Runs one batch at levels 0 and 1 on the in-process group and reads the counted bytes.

    On ``model`` cut to one layer: the tail gathers the hidden states after the last layer,
    so its bytes are those of every depth, at a ``num_layers``-th of the compute."""
    rows = []
    batch = synthetic_batch(bs, extend_len)
    model = model.model_copy(update={"num_layers": 1})
    for cp_size in cp_sizes:
        for cp_mode in CpMode:
            deploy = DeploymentConfig(cp_size=cp_size, cp_mode=cp_mode, page_size=16)
            pages = pages_for_trace([batch], 16, cp_size)
            job = RankJob(
                model, deploy, (batch,), (0, 1), pages, frozenset({PhaseId.NARROW_OUTPUT})
            )
            full, narrow = (
                run.rank_outputs[0][0].gathered_bytes["tail_hidden"]
                for run in run_levels(job, Backend.LOCAL)
            )
            rows.append(TailBytes(cp_size, str(cp_mode), bs, batch.num_tokens, full, narrow))
    return rows
