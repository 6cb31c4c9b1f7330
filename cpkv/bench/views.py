"""The level-2 view variants that the ``peer_read`` and ``overlap`` figures of ``cpkv bench``
share: a history-heavy trace run once per variant per round, in turn, on the bench's gloo
group, so drift hits every variant alike."""

from __future__ import annotations

from collections.abc import Sequence

from cpkv.run.jobs import LevelRun, RankJob
from cpkv_core.config import DeploymentConfig, MaterializeMode, ModelConfig
from cpkv_core.planning import BatchSpec, RequestSpec, pages_for_trace
from phases import PhaseId

LEVEL = int(PhaseId.SHARDED_KV)
"""The figure's level: sharded KV, every read through a view."""
MODES = (MaterializeMode.GATHER, MaterializeMode.PEER_READ)
VARIANTS = (
    (MaterializeMode.GATHER, False),
    (MaterializeMode.PEER_READ, False),
    (MaterializeMode.GATHER, True),
)
"""``(materialize, prefetch)`` of each job of a round: ``peer_read`` compares the first two,
``overlap`` (``bench_overlap``) the first and the third."""


def history_heavy_trace(
    page_size: int, requests: int = 4, history_pages: int = 16, continuations: int = 3
) -> tuple[BatchSpec, ...]:
    """``requests`` requests of ``history_pages`` pages, then ``continuations`` batches that
    each add one page to every request: every later batch reads mostly history."""
    history = history_pages * page_size
    batches = [BatchSpec(0, tuple(RequestSpec(f"h{i}", 0, history) for i in range(requests)))]
    for step in range(continuations):
        done = history + step * page_size
        batches.append(
            BatchSpec(
                step + 1, tuple(RequestSpec(f"h{i}", done, page_size) for i in range(requests))
            )
        )
    return tuple(batches)


def materialize_jobs(
    model: ModelConfig, deploy: DeploymentConfig, repeats: int, device: str = "cpu"
) -> list[RankJob]:
    """A warm-up round and ``repeats`` rounds, each one job per ``VARIANTS`` entry, in
    turn, so drift hits every variant alike."""
    batches = history_heavy_trace(deploy.page_size)
    pages = pages_for_trace(batches, deploy.page_size, deploy.cp_size)
    enabled = frozenset({PhaseId.SHARDED_KV})
    return [
        RankJob(
            model,
            deploy.model_copy(update={"materialize": mode, "materialize_prefetch": prefetch}),
            batches,
            (LEVEL,),
            pages,
            enabled,
            device=device,
        )
        for _ in range(repeats + 1)
        for mode, prefetch in VARIANTS
    ]


def variant_runs(runs: Sequence[LevelRun], variant: int) -> list[LevelRun]:
    """The runs of ``VARIANTS[variant]`` among :func:`materialize_jobs`'s, warm-up first."""
    return list(runs[variant :: len(VARIANTS)])
