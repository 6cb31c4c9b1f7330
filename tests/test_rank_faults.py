"""A rank that fails inside a batch stops the run with an error naming the rank and batch."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

import cpkv.commands.shared as shared_mod
import cpkv.run.pd as pd_mod
from cpkv.cli import app
from cpkv.run.jobs import Backend, RankJob
from cpkv.run.runner import run_levels
from cpkv.run.verify import verify_levels
from cpkv_core.config import model_preset
from cpkv_core.planning import ExecutionPlan, ScheduledBatch, pages_for_trace
from cpkv_core.runtime import RankBatchOutput
from cpkv_core.runtime import engine as engine_mod
from cpkv_core.traces import load_trace
from phases.registry import REGISTERED_PHASES
from tests.conftest import DATA, make_deploy, mixed_trace

cli_runner = CliRunner()


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


@pytest.mark.gloo
def test_a_stalled_gloo_rank_is_named_with_its_batch_within_the_batch_timeout() -> None:
    """A real process stalls mid-run: the others stop after the batch timeout (3 s), not the
    run's (90 s), and the error names the stalled rank and the batch."""
    batches = mixed_trace(4).batches
    job = RankJob(
        model=model_preset("tiny"),
        deploy=make_deploy(2, 4),
        batches=batches,
        levels=(2,),
        num_pages=pages_for_trace(batches, 4, 2),
        batch_timeout_s=3.0,
        stall_at=(1, 2, 120.0),
    )
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"rank 1 stalled \(still running") as caught:
        run_levels(job, Backend.GLOO, timeout_s=90.0)
    assert time.monotonic() - start < 45.0
    message = str(caught.value)
    assert "rank 0 failed in batch 2 (level 2): CollectiveTimeout: rank 0 waited" in message
    assert "over the collective timeout of 3 s" in message
    assert "the group stopped in run 0 batch 2, after batch 1 had finished" in message


class Reached(Exception):
    """Raised by a spy once it has seen what a command handed down."""


LONG = DATA / "long.jsonl"
RUN = ["--cp-size", "2", "--page-size", "4"]


def test_batch_timeout_comes_from_env_config_and_option_and_reaches_the_ranks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[float] = []

    def spy(job: RankJob, *args: object, **kwargs: object) -> None:
        seen.append(job.batch_timeout_s)
        raise Reached

    def gloo(jobs: list[RankJob], *args: object, **kwargs: object) -> None:
        seen.extend(job.batch_timeout_s for job in jobs)
        raise Reached

    monkeypatch.setattr(shared_mod, "run_levels", spy)
    monkeypatch.setattr(pd_mod, "run_jobs_on_gloo", gloo)
    verify = ["verify", str(LONG), *RUN, "--backend", "local"]
    assert isinstance(cli_runner.invoke(app, verify).exception, Reached)
    monkeypatch.setenv("CPKV_BATCH_TIMEOUT_S", "7.5")
    assert isinstance(cli_runner.invoke(app, verify).exception, Reached)
    monkeypatch.delenv("CPKV_BATCH_TIMEOUT_S")
    config = tmp_path / "cpkv.toml"
    config.write_text("batch-timeout-s = 9\n")
    assert isinstance(cli_runner.invoke(app, [*verify, "--config", str(config)]).exception, Reached)
    pd = ["pd", str(LONG), *RUN, "--batch-timeout-s", "4"]
    assert isinstance(cli_runner.invoke(app, pd).exception, Reached)
    assert seen == [60.0, 7.5, 9.0, 4.0]


@pytest.mark.parametrize("command", ["verify", "pd", "demo"])
@pytest.mark.parametrize("value", ["0", "-1", "nan", "1e9"])
def test_a_bad_batch_timeout_is_bad_input(command: str, value: str) -> None:
    args = [command, *([str(LONG)] if command != "demo" else []), *RUN]
    result = cli_runner.invoke(app, [*args, "--batch-timeout-s", value])
    assert result.exit_code == 2, result.output
    assert "batch-timeout-s" in result.stderr.replace("batch_timeout_s", "batch-timeout-s")
