"""Comparisons fail on NaN or Inf anywhere in an output, and an engine whose outputs are NaN
stops the run before they are compared, whatever the cp size."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from cpkv.run.jobs import Backend
from cpkv.run.verify import verify_levels
from cpkv_core.config import model_preset
from cpkv_core.runtime import BatchOutput, RequestOutput, compare_batch, max_abs_diff
from cpkv_core.runtime import engine as engine_mod
from cpkv_core.runtime.model import lm_head
from cpkv_core.runtime.weights import ModelWeights
from phases import PhaseId
from tests.conftest import make_deploy, mixed_trace

TINY = model_preset("tiny")


def make_output(hidden: Tensor, logits: Tensor) -> BatchOutput:
    topk = torch.zeros(1, 1, 2, dtype=torch.int64)
    return BatchOutput(0, (RequestOutput("a", hidden, logits, topk),))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("where", ["candidate", "reference"])
def test_comparison_fails_on_one_nonfinite_value(bad: float, where: str) -> None:
    good = make_output(torch.ones(4), torch.ones(3))
    logits = torch.ones(3)
    logits[1] = bad
    broken = make_output(torch.ones(4), logits)
    ref, got = (good, broken) if where == "candidate" else (broken, good)
    cmp = compare_batch(ref, got)
    assert not cmp.ok
    assert cmp.nonfinite == 1
    assert max_abs_diff(ref.requests[0].logits, got.requests[0].logits) == float("inf")


def test_comparison_fails_on_all_nan_outputs() -> None:
    nan = make_output(torch.full((4,), float("nan")), torch.full((3,), float("nan")))
    cmp = compare_batch(make_output(torch.ones(4), torch.ones(3)), nan)
    assert not cmp.ok and cmp.nonfinite == 7


@pytest.mark.parametrize("cp_size", [1, 2, 3, 4])
def test_an_engine_that_outputs_nan_stops_the_run_named(
    cp_size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NaN outputs are caught before the batch commits, whatever the cp size (at cp 1 no
    other rank compares them): they are blamed on the tail, whose input was finite; where
    the batch took phase 1's narrow tail it is dropped and the batch rerun on the full
    gather, which fails too. Phase 0's tail has no fallback: the run stops, named, and no
    NaN output reaches the comparison."""

    def nan_head(weights: ModelWeights, last_hidden: Tensor) -> tuple[Tensor, Tensor]:
        normed, logits = lm_head(weights, last_hidden)
        return torch.full_like(normed, float("nan")), torch.full_like(logits, float("nan"))

    monkeypatch.setattr(engine_mod, "lm_head", nan_head)
    deploy = make_deploy(cp_size, 4)
    batches = mixed_trace(4).batches
    enabled = frozenset({PhaseId.NARROW_OUTPUT})
    words = (
        r"batch 0 \(level 1\) failed with cause=nonfinite ranks=[0-9,]+ at=output: "
        r"the batch's outputs hold a NaN or an infinity; no phase is left to drop: the "
        r"failure is in phase 0's path \(output\)"
    )
    with pytest.raises(RuntimeError, match=words):
        verify_levels(TINY, deploy, batches, (1,), enabled, Backend.LOCAL)
