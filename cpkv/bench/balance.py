"""The ``balance`` figure of ``cpkv bench``: how evenly each split loads the CP ranks, and what
the page interleave saves on the write path under ``round-robin-split``.

Balance is host integer math, no rank runs: the ``trace synth`` presets (chat, long-doc,
agent, at their small and full sizes, seed 1, the bench's page size) are scheduled as a
round-robin deployment at level 4 or 5 schedules them (each batch's new pages dealt in one
cycle, ``OwnerPolicy.BATCH_DEALT``; the other splits depend on lengths only), at cp 2, 4
and 8. For every batch and split, each rank's current tokens and causal attention work
(queries x keys they attend, ``planning.balance``). A batch takes as long as its busiest
rank, so the headline is the busiest rank over the mean, summed over the trace's batches.
Two rows are what phase 4 does: the page interleave where the balance rule lets it
(``page-interleaved+rule``, round-robin), the page-aligned zigzag where no request is short
(in-seq); each keeps its mode's token-balanced split on the other batches.

The write path runs the bench trace at levels 4 and 5 under round-robin on the in-process
group: rank 0's current-chunk gather per batch and whether the write needed it (0 for every
phase-5 batch: each rank writes the pages it computed, which it owns).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from cpkv.bench.byte_model import one_head
from cpkv.bench.bytes import WritePathBytes, write_path_bytes
from cpkv.bench.measure import ALL_PHASES
from cpkv.run.jobs import Backend, RankJob
from cpkv.run.runner import run_levels
from cpkv.synth.presets import PRESETS, Size
from cpkv.synth.scheduler import schedule
from cpkv_core.config import CpMode, DeploymentConfig, ModelConfig
from cpkv_core.planning import (
    BatchSpec,
    OwnerPolicy,
    RankLoad,
    ScheduledBatch,
    Scheduler,
    SplitStrategy,
    page_interleave_fits,
    pages_for_trace,
    split_load,
)
from cpkv_core.planning.split_page_aligned import short_requests

BALANCE_PRESETS = ("chat", "long-doc", "agent")
BALANCE_CP_SIZES = (2, 4, 8)
BALANCE_SEED = 1
INTERLEAVE_RULE = "page-interleaved+rule"
"""Phase 4 under round-robin: the page interleave where the balance rule holds."""
ALIGNED_RULE = "page-aligned-zigzag+rule"
"""Phase 4 under in-seq: the page-aligned zigzag where no request is short."""


@dataclass(frozen=True, slots=True)
class SplitBalance:
    """One split's load over one preset's trace at one CP size."""

    size: str
    preset: str
    cp_size: int
    split: str
    batches: int
    applied: int
    """Batches that took the split (the ``+rule`` rows: the rest kept token balance)."""
    tokens_by_rank: tuple[int, ...]
    """Current tokens each rank computed over the trace."""
    work_by_rank: tuple[int, ...]
    """Causal attention work (queries x keys) of each rank over the trace."""
    tokens_max_over_mean: float
    """Sum over batches of the busiest rank's tokens, over the sum of the means."""
    work_max_over_mean: float
    """The same for causal attention work."""
    worst_work_max_over_mean: float
    """The worst batch's busiest rank's work over its mean."""


class _Tally:
    """Sums of one split's per-batch loads."""

    def __init__(self, cp_size: int) -> None:
        self.tokens, self.work = [0] * cp_size, [0] * cp_size
        self.max_tokens = self.max_work = self.mean_tokens = self.mean_work = 0.0
        self.worst, self.batches, self.applied = 1.0, 0, 0

    def add(self, load: RankLoad, applied: bool) -> None:
        cp = len(load.tokens)
        self.tokens = [a + b for a, b in zip(self.tokens, load.tokens, strict=True)]
        self.work = [a + b for a, b in zip(self.work, load.work, strict=True)]
        self.max_tokens += max(load.tokens)
        self.max_work += max(load.work)
        self.mean_tokens += sum(load.tokens) / cp
        self.mean_work += sum(load.work) / cp
        self.worst = max(self.worst, load.work_max_over_mean)
        self.batches += 1
        self.applied += applied

    def row(self, size: str, preset: str, cp_size: int, split: str) -> SplitBalance:
        return SplitBalance(
            size,
            preset,
            cp_size,
            split,
            self.batches,
            self.applied,
            tuple(self.tokens),
            tuple(self.work),
            self.max_tokens / self.mean_tokens if self.mean_tokens else 1.0,
            self.max_work / self.mean_work if self.mean_work else 1.0,
            self.worst,
        )


def _loads(batch: ScheduledBatch) -> dict[str, tuple[RankLoad, bool]]:
    """Every split's load of one scheduled batch, and whether it took the split."""

    tables = [r.page_table for r in batch.requests]

    def load(strategy: SplitStrategy) -> RankLoad:
        return split_load(
            strategy, batch.extend_lens, batch.prefix_lens, tables, batch.cp_size, batch.page_size
        )

    token_rr, page_rr, zigzag = (
        load(SplitStrategy.ROUND_ROBIN),
        load(SplitStrategy.PAGE_INTERLEAVED),
        load(SplitStrategy.ZIGZAG),
    )
    fits = page_interleave_fits(page_rr)
    short = bool(
        short_requests(batch.extend_lens, batch.prefix_lens, batch.cp_size, batch.page_size)
    )
    aligned = zigzag if short else load(SplitStrategy.PAGE_ALIGNED_ZIGZAG)
    return {
        str(SplitStrategy.ROUND_ROBIN): (token_rr, True),
        str(SplitStrategy.PAGE_INTERLEAVED): (page_rr, True),
        INTERLEAVE_RULE: (page_rr if fits else token_rr, fits),
        str(SplitStrategy.ZIGZAG): (zigzag, True),
        ALIGNED_RULE: (aligned, not short),
    }


def preset_balance(
    batches: Sequence[BatchSpec], size: str, preset: str, cp_size: int, page_size: int
) -> list[SplitBalance]:
    """Every split's row for one trace at one CP size."""
    scheduler = Scheduler(pages_for_trace(batches, page_size, cp_size), page_size, cp_size)
    tallies: dict[str, _Tally] = {}
    for batch in batches:
        scheduled = scheduler.schedule(batch, OwnerPolicy.BATCH_DEALT)
        for split, (load, applied) in _loads(scheduled).items():
            tallies.setdefault(split, _Tally(cp_size)).add(load, applied)
    return [tally.row(size, preset, cp_size, split) for split, tally in tallies.items()]


def bench_balance(page_size: int) -> list[SplitBalance]:
    """The presets at both sizes, every split, cp 2/4/8."""
    rows = []
    for size in (Size.SMALL, Size.FULL):
        for name in BALANCE_PRESETS:
            preset = PRESETS[(name, size)]
            scheduler = preset.scheduler.model_copy(update={"page_size": page_size})
            batches = schedule(preset.make(BALANCE_SEED), scheduler)
            for cp_size in BALANCE_CP_SIZES:
                rows += preset_balance(batches, str(size), name, cp_size, page_size)
    return rows


def round_robin_write_path(
    model: ModelConfig, deploy: DeploymentConfig, batches: Sequence[BatchSpec], device: str
) -> list[WritePathBytes]:
    """Levels 4 and 5 of ``batches`` under round-robin on the in-process group, on
    ``one_head(model)`` (it counts bytes alone)."""
    rr = deploy.model_copy(update={"cp_mode": CpMode.ROUND_ROBIN_SPLIT})
    pages = pages_for_trace(batches, rr.page_size, rr.cp_size)
    job = RankJob(one_head(model), rr, tuple(batches), (4, 5), pages, ALL_PHASES, device=device)
    return write_path_bytes(run_levels(job, Backend.LOCAL))


@dataclass(frozen=True, slots=True)
class BalanceFigure:
    """The split balance rows and the round-robin write path."""

    page_size: int
    splits: list[SplitBalance]
    write_path: list[WritePathBytes]
    cp_size: int
    """CP size of the write-path run."""

    def to_json(self) -> dict[str, Any]:
        """The ``balance`` and ``write_path_round_robin`` sections of ``cpkv bench --json``."""
        return {
            "balance": {
                "page_size": self.page_size,
                "seed": BALANCE_SEED,
                "splits": [asdict(row) for row in self.splits],
            },
            "write_path_round_robin": {
                "cp_size": self.cp_size,
                "cp_mode": str(CpMode.ROUND_ROBIN_SPLIT),
                "rows": [
                    asdict(row) | {"write_path_bytes": row.write_path_bytes}
                    for row in self.write_path
                ],
            },
        }


def balance_figure(
    model: ModelConfig,
    deploy: DeploymentConfig,
    batches: Sequence[BatchSpec],
    device: str = "cpu",
    step: Callable[[str], None] | None = None,
) -> BalanceFigure:
    """Both parts of the figure; ``step`` hears each part's name as it starts."""
    if step is not None:
        step(f"split balance: synth presets at cp 2/4/8, page {deploy.page_size}")
    splits = bench_balance(deploy.page_size)
    if step is not None:
        step(f"round-robin write path, levels 4/5, {deploy.cp_size} in-process ranks")
    write_path = round_robin_write_path(model, deploy, batches, device)
    return BalanceFigure(deploy.page_size, splits, write_path, deploy.cp_size)
