"""``cpkv bench --rows MODEL``: cpkv's data movement at a production model's row widths and
lengths, against the copy ceiling of the device it runs on.

Every op of ``ops`` runs on rank 0 of every point of the grid
(``setup``), with the model's per-token per-layer rows in their storage dtype
and random bytes: the engine's index plans and calls, no model maths. Per op and point:
the bytes it writes, its median time and that of a contiguous copy of the same bytes timed
round by round with it (``ratio_to_copy``, with its spread over the rounds:
``rounds``), the rounds of ``PLACEMENTS`` passes over the grid pooled, and the peak
scratch of one call next to what ``cpkv plan`` budgets for
it. From those: a projection per chunk over all the model's
layers at each level, and slot against unique remap. ``docs/real-rows.md`` reads them.
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from cpkv.bench.rows.ceiling import CopyCeiling, copy_buffer_bytes, last_level_cache_bytes
from cpkv.bench.rows.figures import RowsEntry, projection, slot_vs_unique
from cpkv.bench.rows.group import RankAlone
from cpkv.bench.rows.measure import Clock, peak_scratch, reusing_allocator
from cpkv.bench.rows.ops import RowOp, chunk_ops, replicated_ops, sharded_ops
from cpkv.bench.rows.rounds import op_clock, time_op
from cpkv.bench.rows.setup import RANK, PointSetup, RowFormat, RowsGrid, RowsPoint, row_format
from cpkv.bench.rows.timing import NOISY_SPREAD, Timing
from cpkv.plan.kv_bytes import KvCacheDtype
from cpkv_core.config import ModelConfig

__all__ = [
    "GOAL_RATIO",
    "PLACEMENTS",
    "ROWS_REPEATS",
    "RowsReport",
    "pooled_passes",
    "run_rows_bench",
]

GOAL_RATIO = 0.5
"""The goal of every op at the grid's longest history: half the copy ceiling or better."""
PLAN_REPEATS = 3
"""Host plan timings per view strategy (median)."""
PLACEMENTS = 3
"""Passes over the grid, each building every point's buffers afresh; each op's rounds of
every pass are pooled into one timing (``timing``). Where an op's buffers land moves its
time by more than its rounds at one placement spread (docs/real-rows.md): over three, the
next run's figure fell inside the spread for 83-94 of the 96 entries at 128K over three
pairs of runs on an AMD VM (89 before the pack's host work was cut, 77-90 with the
row-by-row gathers, 65-86 over two passes), and for 84-93 on a Xeon VM (full runs and
runs of the 128K points alone), whose large ops' rounds agree within 1-3% while its runs
drift by about 1%; five rounds a pass held no better there, nor nine passes (85-95 of
96): the misses are the run's drift, which passes inside a run do not sample."""
ROWS_REPEATS = 3
"""Least timed rounds of an op in one pass (a short op takes more: ``rounds``)."""


def _measure(
    op: RowOp,
    point: RowsPoint,
    ceiling: CopyCeiling,
    repeats: int,
    device: torch.device,
    clock: Clock,
    profile: bool,
) -> RowsEntry:
    if op.first_run is None:
        op.run()  # NOTE: a warm-up makes the peers' parts, so the profile sees the op alone
    # NOTE: the batch's first call before the rounds, so the fresh buffers it allocates never
    # sit beside the reused ones; profiled in the first pass only (``pooled_passes``).
    first = op.first_run or op.run
    scratch = peak_scratch(first, device) if profile else 0
    if not profile:
        first()
    timing = time_op(op.run, op.bytes, ceiling, repeats, device, clock)
    plan_seconds = None
    if op.plan_seconds is not None and profile:
        plan_seconds = statistics.median(op.plan_seconds() for _ in range(PLAN_REPEATS))
    return RowsEntry(
        op=op.op,
        variant=op.variant,
        history=point.history,
        cp_size=point.cp_size,
        bs=point.bs,
        shared_prefix=point.shared_prefix,
        per=op.per,
        levels=op.levels,
        bytes=op.bytes,
        timing=timing,
        scratch_bytes=scratch,
        planned_scratch_bytes=op.planned_scratch_bytes,
        budget=op.budget,
        plan_seconds=plan_seconds,
    )


def measure_point(
    model: ModelConfig,
    fmt: RowFormat,
    point: RowsPoint,
    grid: RowsGrid,
    ceiling: CopyCeiling,
    repeats: int,
    device: torch.device,
    clock: Clock,
    profile: bool = True,
) -> list[RowsEntry]:
    """Every op of one point; the shards are freed before the replicated pool is made.
    Without ``profile``, no scratch (0) and no plan time (None): the timings alone."""
    setup = PointSetup(model, fmt, point, grid, str(device))
    entries: list[RowsEntry] = []
    comm = RankAlone(RANK, point.cp_size)
    groups: list[Iterable[RowOp]] = [sharded_ops(setup, comm, model.num_layers)]
    if not point.shared_prefix:
        groups += [replicated_ops(setup, comm), chunk_ops(setup)]
    for group in groups:
        for op in group:
            entries.append(_measure(op, point, ceiling, repeats, device, clock, profile))
            del op
        setup.free_shards()
        comm.forget_parts()
        gc.collect()
    return entries


@dataclass(frozen=True, slots=True)
class RowsReport:
    """One ``cpkv bench --rows`` run."""

    model: str
    kv_cache_dtype: str
    row_bytes: int
    hidden_bytes: int
    num_layers: int
    grid: RowsGrid
    device: str
    allocator: str
    threads: int
    clock: str
    """What the rounds are timed on: ``thread-cpu``, ``wall`` or ``cuda-events``
    (``rounds.op_clock``)."""
    seconds: float
    """Wall time of the whole run."""
    entries: list[RowsEntry]
    warnings: list[str]
    placements: int = 1
    """Passes over the grid whose rounds each entry pools."""
    copy_buffer_bytes: int = 0
    """Each of the copy ceiling's two buffers (``ceiling.copy_buffer_bytes``)."""
    last_level_cache_bytes: int = 0
    """The device's last-level cache the ceiling's buffers exceed (0: not known)."""

    @property
    def below_goal(self) -> list[RowsEntry]:
        """Entries at the grid's longest history under ``GOAL_RATIO``."""
        longest = max(self.grid.histories)
        return [e for e in self.entries if e.history == longest and e.ratio_to_copy < GOAL_RATIO]

    def to_json(self) -> dict[str, Any]:
        """The JSON document of ``cpkv bench --rows MODEL --json``."""
        return {
            "warnings": self.warnings,
            "real_rows_setup": {
                "model": self.model,
                "kv_cache_dtype": self.kv_cache_dtype,
                "row_bytes_per_token_per_layer": self.row_bytes,
                "hidden_bytes_per_token": self.hidden_bytes,
                "num_layers": self.num_layers,
                "grid": asdict(self.grid),
                "rank": RANK,
                "device": self.device,
                "allocator": self.allocator,
                "torch_threads": self.threads,
                "clock": self.clock,
                "placements": self.placements,
                "copy_buffer_bytes": self.copy_buffer_bytes,
                "last_level_cache_bytes": self.last_level_cache_bytes or None,
                "seconds": self.seconds,
                "goal_ratio_to_copy": GOAL_RATIO,
                "noisy_spread": NOISY_SPREAD,
                "noisy": sum(e.timing.noisy for e in self.entries),
            },
            "real_rows": [e.to_json() for e in self.entries],
            "real_rows_projection": [asdict(r) for r in projection(self.entries, self.num_layers)],
            "slot_vs_unique": [r.to_json() for r in slot_vs_unique(self.entries, self.num_layers)],
        }


def pooled_passes(passes: Sequence[Sequence[RowsEntry]]) -> list[RowsEntry]:
    """Each entry of the first pass with the rounds of every pass pooled (``Timing.pooled``);
    its scratch and plan time are the first pass's (later passes time the rounds alone). The
    passes list the same ops in the same order."""
    pooled = []
    for same_op in zip(*passes, strict=True):
        first = same_op[0]
        if any(_identity(other) != _identity(first) for other in same_op):
            raise RuntimeError(f"passes over the grid disagree at {_identity(first)}")
        pooled.append(dataclasses.replace(first, timing=Timing.pooled([e.timing for e in same_op])))
    return pooled


def _identity(entry: RowsEntry) -> tuple[object, ...]:
    """What makes two entries one op at one point."""
    e = entry
    return (e.op, e.variant, e.history, e.cp_size, e.bs, e.shared_prefix, e.bytes)


def run_rows_bench(
    model: ModelConfig,
    kv_dtype: KvCacheDtype,
    grid: RowsGrid,
    repeats: int = ROWS_REPEATS,
    device: str = "cpu",
    on_step: Callable[[str], None] | None = None,
    warnings: Sequence[str] = (),
    placements: int = PLACEMENTS,
) -> RowsReport:
    """Measures every op at every point of ``grid``, ``placements`` times over (at least
    ``repeats`` rounds each time); ``on_step`` hears each point."""
    if placements < 1:
        raise ValueError(f"a run takes at least one pass over the grid, not {placements}")
    began = time.perf_counter()
    fmt = row_format(model, kv_dtype)
    run_device = torch.device(device)
    cache_bytes = last_level_cache_bytes(run_device)
    ceiling = CopyCeiling(run_device, buffer_bytes=copy_buffer_bytes(cache_bytes))
    clock_name, clock = op_clock(run_device)
    passes: list[list[RowsEntry]] = []
    with reusing_allocator(run_device) as allocator:
        for placement in range(placements):
            entries: list[RowsEntry] = []
            for point in grid.points():
                if on_step is not None:
                    on_step(
                        f"{model.name} rows, pass {placement + 1}/{placements}: history "
                        f"{point.history}, bs {point.bs}, cp {point.cp_size}"
                        f"{', shared prefix' if point.shared_prefix else ''}"
                    )
                entries += measure_point(
                    model, fmt, point, grid, ceiling, repeats, run_device, clock, placement == 0
                )
            passes.append(entries)
    notes = list(warnings)
    if allocator == "system":
        notes.append("no glibc to keep freed memory: fresh CPU tensors pay their page faults")
    return RowsReport(
        model=model.name,
        kv_cache_dtype=str(kv_dtype),
        row_bytes=fmt.row_bytes,
        hidden_bytes=fmt.hidden_bytes,
        num_layers=model.num_layers,
        grid=grid,
        device=device,
        allocator=allocator,
        threads=torch.get_num_threads(),
        clock=clock_name,
        seconds=time.perf_counter() - began,
        entries=pooled_passes(passes),
        warnings=notes,
        placements=placements,
        copy_buffer_bytes=ceiling.buffer_bytes,
        last_level_cache_bytes=cache_bytes,
    )
