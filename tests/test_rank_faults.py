"""A rank that fails inside a batch stops the run with an error naming the rank and batch."""

from __future__ import annotations

import time

import pytest

from cpkv.runner import Backend, RankJob, run_levels
from cpkv.verify import verify_levels
from cpkv_core.config import model_preset
from cpkv_core.planning import ExecutionPlan, ScheduledBatch, pages_for_trace
from cpkv_core.runtime import RankBatchOutput
from cpkv_core.runtime import engine as engine_mod
from phases.registry import REGISTERED_PHASES
from tests.conftest import make_deploy, mixed_trace


def test_a_rank_that_raises_is_named_with_its_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    real = engine_mod.CPEngine.run_batch

    def failing(
        self: engine_mod.CPEngine, batch: ScheduledBatch, plan: ExecutionPlan, *args: object
    ) -> RankBatchOutput:
        if self.comm.rank == 1 and batch.batch == 2:
            raise OSError("device lost")
        return real(self, batch, plan, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(engine_mod.CPEngine, "run_batch", failing)
    with pytest.raises(
        RuntimeError, match=r"rank 1 failed in batch 2 \(level 2\): OSError: device lost"
    ):
        verify_levels(
            model_preset("tiny"),
            make_deploy(3, 4),
            mixed_trace(4).batches,
            (2,),
            frozenset(REGISTERED_PHASES),
            Backend.LOCAL,
        )


@pytest.mark.gloo
def test_a_killed_gloo_rank_stops_the_group_naming_rank_and_batch() -> None:
    """A real process dies mid-run: the others are torn down within the timeout, and the
    error names the dead rank and the last batch the group finished."""
    batches = mixed_trace(4).batches
    job = RankJob(
        model=model_preset("tiny"),
        deploy=make_deploy(2, 4),
        batches=batches,
        levels=(2,),
        num_pages=pages_for_trace(batches, 4, 2),
        exit_at=(1, 2),
    )
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"rank 1 exited with code 17[\s\S]*after run 0 batch 1"):
        run_levels(job, Backend.GLOO, timeout_s=60.0)
    assert time.monotonic() - start < 60.0
