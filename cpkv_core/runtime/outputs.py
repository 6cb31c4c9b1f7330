"""What a batch produces, and how a run is compared with the reference."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from cpkv_core.planning.batch import BatchSpec

OUTPUT_ATOL = 1e-5
"""Largest accepted absolute difference of fp32 outputs (last hidden, logits).

The math is batch invariant, so CP and the reference normally agree bitwise (difference
0.0); the tolerance only absorbs an fp64 ``exp`` that rounds differently on a SIMD lane.
"""


@dataclass(frozen=True, slots=True)
class RequestOutput:
    """One request's result for one batch."""

    rid: str
    last_hidden: Tensor  # [hidden] final-normed hidden state of the last current token
    logits: Tensor  # [vocab]
    topk: Tensor  # [num_layers, extend_len, index_topk] int64 logical key positions


@dataclass(frozen=True, slots=True)
class BatchOutput:
    """Every request's result for one batch, in batch order."""

    batch: int
    requests: tuple[RequestOutput, ...]


@dataclass(frozen=True, slots=True)
class BatchComparison:
    """How one batch of a run compares with the reference."""

    batch: int
    max_abs_diff: float
    topk_equal: bool
    topk_mismatches: int
    """Query rows (summed over layers) whose selected key set differs."""

    @property
    def ok(self) -> bool:
        """Top-k sets equal and outputs within ``OUTPUT_ATOL``."""
        return self.topk_equal and self.max_abs_diff <= OUTPUT_ATOL


def compare_batch(reference: BatchOutput, candidate: BatchOutput) -> BatchComparison:
    """Compares ``candidate`` with ``reference``; both must hold the same requests."""
    if [r.rid for r in reference.requests] != [r.rid for r in candidate.requests]:
        raise RuntimeError(
            f"batch {reference.batch}: request order differs between reference and candidate, "
            "indicates a bug in output collection"
        )
    max_diff = 0.0
    mismatches = 0
    for ref, got in zip(reference.requests, candidate.requests, strict=True):
        for a, b in ((ref.last_hidden, got.last_hidden), (ref.logits, got.logits)):
            max_diff = max(max_diff, float((a - b).abs().max()))
        if ref.topk.shape != got.topk.shape:
            mismatches += int(ref.topk.shape[0] * ref.topk.shape[1])
            continue
        rows_differ = (ref.topk != got.topk).any(dim=-1)
        mismatches += int(rows_differ.sum())
    return BatchComparison(
        batch=reference.batch,
        max_abs_diff=max_diff,
        topk_equal=mismatches == 0,
        topk_mismatches=mismatches,
    )


@dataclass(frozen=True, slots=True)
class RankBatchOutput:
    """What one rank returns for one batch."""

    batch: int
    rank: int
    local_token_indices: Tensor  # [n_local]
    topk: Tensor  # [num_layers, n_local, index_topk] logical key positions
    last_hidden: Tensor  # [bs, hidden] final-normed
    logits: Tensor  # [bs, vocab]
    gathered_bytes: dict[str, int]  # bytes gathered by this rank in this batch, per tag
    kv_bytes: int  # persistent KV bytes in use on this rank after the batch
    seconds: float  # wall time of the batch on this rank, host planning included


def merge_rank_outputs(batch: BatchSpec, outputs: Sequence[RankBatchOutput]) -> BatchOutput:
    """Assembles every rank's piece of a batch into one ``BatchOutput`` in batch order.

    Every rank computes the last-token outputs from the same gathered states, so they must
    agree bitwise; a disagreement is a bug in collection and raises RuntimeError.
    """
    first = outputs[0]
    for other in outputs[1:]:
        if not (
            torch.equal(first.last_hidden, other.last_hidden)
            and torch.equal(first.logits, other.logits)
        ):
            raise RuntimeError(
                f"batch {batch.batch}: ranks {first.rank} and {other.rank} disagree on the "
                "last-token outputs, indicates a bug in output collection"
            )
    num_layers, _, topk = first.topk.shape
    topk_full = first.topk.new_full((num_layers, batch.num_tokens, topk), -1)
    for out in outputs:
        topk_full[:, out.local_token_indices] = out.topk
    pieces = torch.split(topk_full, list(batch.extend_lens), dim=1)
    return BatchOutput(
        batch.batch,
        tuple(
            RequestOutput(req.rid, first.last_hidden[i], first.logits[i], pieces[i])
            for i, req in enumerate(batch.requests)
        ),
    )


def stack_topk(per_layer: list[Tensor]) -> Tensor:
    """``[num_layers, n, topk]`` from one ``[n, topk]`` tensor per layer."""
    return torch.stack(per_layer, dim=0)
