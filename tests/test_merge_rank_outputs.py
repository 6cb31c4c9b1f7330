"""Merging every rank's piece of a batch: the top-k rows go back to batch order, and ranks
that disagree on the last-token outputs (which every rank computes alike) are a collection
bug, whereas a NaN every rank computed alike is left to the comparison."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from cpkv_core.planning import BatchSpec, RequestSpec
from cpkv_core.runtime import RankBatchOutput, compare_batch, merge_rank_outputs

BATCH = BatchSpec(0, (RequestSpec("a", 0, 3), RequestSpec("b", 4, 2)))
"""Five current tokens: rank 0 computed tokens 0, 1, 4, rank 1 tokens 2, 3."""
LOCAL = ((0, 1, 4), (2, 3))


def piece(rank: int, last_hidden: Tensor, logits: Tensor) -> RankBatchOutput:
    """Rank ``rank``'s output; the top-k of batch token ``g`` in layer ``l`` is ``10 l + g``."""
    local = torch.tensor(LOCAL[rank], dtype=torch.int64)
    topk = torch.stack([10 * layer + local for layer in range(2)])[:, :, None]
    return RankBatchOutput(
        batch=0,
        rank=rank,
        local_token_indices=local,
        topk=topk,
        last_hidden=last_hidden.clone(),
        logits=logits.clone(),
        gathered_bytes={},
        kv_bytes=0,
        seconds=0.0,
    )


def test_merge_puts_every_ranks_topk_rows_back_in_batch_order() -> None:
    hidden, logits = torch.ones(2, 4), torch.ones(2, 3)
    merged = merge_rank_outputs(BATCH, [piece(0, hidden, logits), piece(1, hidden, logits)])
    assert [r.rid for r in merged.requests] == ["a", "b"]
    want = torch.stack([10 * layer + torch.arange(5) for layer in range(2)])[:, :, None]
    assert torch.equal(torch.cat([r.topk for r in merged.requests], dim=1), want)


@pytest.mark.parametrize("what", ["last_hidden", "logits"])
def test_ranks_that_disagree_on_the_last_token_outputs_raise(what: str) -> None:
    """One bit of one value differs on rank 1: the merge must not pick rank 0's silently."""
    hidden, logits = torch.ones(2, 4), torch.ones(2, 3)
    other = {"last_hidden": hidden.clone(), "logits": logits.clone()}
    other[what][1, 0] = torch.nextafter(torch.tensor(1.0), torch.tensor(2.0))
    pieces = [piece(0, hidden, logits), piece(1, other["last_hidden"], other["logits"])]
    with pytest.raises(RuntimeError, match="ranks 0 and 1 disagree on the last-token outputs"):
        merge_rank_outputs(BATCH, pieces)


def test_a_nan_every_rank_computed_alike_merges_and_fails_the_comparison() -> None:
    hidden, logits = torch.ones(2, 4), torch.ones(2, 3)
    nan_logits = logits.clone()
    nan_logits[0, 1] = float("nan")
    good = merge_rank_outputs(BATCH, [piece(0, hidden, logits), piece(1, hidden, logits)])
    bad = merge_rank_outputs(BATCH, [piece(0, hidden, nan_logits), piece(1, hidden, nan_logits)])
    comparison = compare_batch(good, bad)
    assert not comparison.ok and comparison.nonfinite == 1
