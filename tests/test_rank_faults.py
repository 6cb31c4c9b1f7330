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
from cpkv_core.traces import load_trace
from phases.registry import REGISTERED_PHASES
from tests.conftest import DATA, make_deploy, mixed_trace


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
    """A real process dies mid-run: the others are torn down within the timeout, the error
    names the dead rank and the batch, and the survivor rolled that batch back."""
    # NOTE: batch 1 of long.jsonl takes phase 5 with history: the survivor's direct write
    # of layer 0 lands in its pool before its first collective fails.
    batches = load_trace(DATA / "long.jsonl", 4).batches
    job = RankJob(
        model=model_preset("tiny"),
        deploy=make_deploy(2, 4),
        batches=batches,
        levels=(5,),
        num_pages=pages_for_trace(batches, 4, 2),
        exit_at=(1, 1),
        debug_checks=True,
    )
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"rank 1 exited with code 17[\s\S]*") as caught:
        run_levels(job, Backend.GLOO, timeout_s=60.0)
    assert time.monotonic() - start < 60.0
    message = str(caught.value)
    assert "the group stopped in run 0 batch 1, after batch 0 had finished" in message
    # The survivor was inside batch 1 when its peer died: it committed nothing, and its
    # pool, requests and scheduler are as before the batch (digests compared).
    assert "rank 0 failed in batch 1 (level 5)" in message
    assert "batch 1 rolled back: pool, requests and scheduler as before it (checked)" in message
