"""The output tolerance is 1e-5: a difference between 1e-5 and 1e-3 fails the comparison,
at the function verify compares with and end to end through ``cpkv verify``; a level's
verdict and largest difference cover every batch."""

from __future__ import annotations

import json

import pytest
import torch
from torch import Tensor
from typer.testing import CliRunner

from cpkv.cli import app
from cpkv.run.verify import BatchRow, LevelReport, VerifyReport
from cpkv_core.config import DeploymentConfig
from cpkv_core.planning import BatchSpec, RequestSpec, Scheduler
from cpkv_core.runtime import BatchComparison, BatchOutput, RequestOutput, compare_batch
from cpkv_core.runtime import engine as engine_mod
from cpkv_core.runtime.model import lm_head
from cpkv_core.runtime.weights import ModelWeights
from phases import Gate, PhaseId
from tests.conftest import MIXED_TRACE

runner = CliRunner()


def make_output(logits: Tensor) -> BatchOutput:
    topk = torch.zeros(1, 1, 2, dtype=torch.int64)
    return BatchOutput(0, (RequestOutput("a", torch.zeros(4), logits, topk),))


@pytest.mark.parametrize("diff", [2e-5, 1e-4, 9e-4])
def test_a_difference_above_1e_5_fails_the_comparison(diff: float) -> None:
    cmp = compare_batch(make_output(torch.zeros(3)), make_output(torch.tensor([0.0, diff, 0.0])))
    assert not cmp.ok
    assert cmp.max_abs_diff == pytest.approx(diff, rel=1e-6)


@pytest.mark.parametrize("diff", [0.0, 5e-6])
def test_a_difference_within_1e_5_passes(diff: float) -> None:
    assert compare_batch(make_output(torch.zeros(3)), make_output(torch.full((3,), diff))).ok


def test_verify_fails_when_the_engine_is_off_by_1e_4(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every CP rank's logits shifted by 1e-4 (the reference's are not): exit 1, every level
    reported off by about 1e-4 against the stated tolerance 1e-5."""

    def shifted_head(weights: ModelWeights, last_hidden: Tensor) -> tuple[Tensor, Tensor]:
        normed, logits = lm_head(weights, last_hidden)
        return normed, logits + 1e-4

    monkeypatch.setattr(engine_mod, "lm_head", shifted_head)
    args = ["verify", str(MIXED_TRACE), "--phases", "1", "--cp-size", "2", "--page-size", "4"]
    result = runner.invoke(app, [*args, "--backend", "local", "--json"])
    assert result.exit_code == 1, result.output
    document = json.loads(result.stdout)
    assert document["ok"] is False and document["tolerance"]["outputs_atol"] == 1e-5
    for level in document["levels"]:
        assert not level["ok"] and level["max_abs_diff"] == pytest.approx(1e-4, rel=0.05)


def test_a_level_reports_its_largest_batch_difference_and_fails_on_any_batch() -> None:
    """Only the middle batch is off: the level's ``max_abs_diff`` is that batch's, not the
    first's, and the level fails, in the report and in its JSON."""
    deploy = DeploymentConfig(cp_size=2, page_size=4)
    batch = Scheduler(64, 4, 2).schedule(BatchSpec(0, (RequestSpec("a", 0, 16),)))
    plan = Gate(frozenset({PhaseId.NARROW_OUTPUT}), deploy).decide(batch)
    rows = tuple(
        BatchRow(1, index, plan, 16, (0, 0), {}, (0, 0), BatchComparison(index, diff, True, 0))
        for index, diff in enumerate([0.0, 3e-4, 1e-6])
    )
    level = LevelReport(1, rows)
    assert level.max_abs_diff == 3e-4 and not level.ok
    document = VerifyReport((level,)).to_json()
    assert document["levels"] == [{"level": 1, "ok": False, "max_abs_diff": 3e-4}]
    assert document["ok"] is False
