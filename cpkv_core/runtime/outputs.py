"""What a batch produces (the run step's outputs, the path a batch delivers, one rank's
result), and how a run is compared with the reference."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from cpkv_core.planning.batch import BatchSpec
from cpkv_core.planning.host_plan import HostPlan
from cpkv_core.runtime.device_plan import BatchTensors

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
    nonfinite: int = 0
    """Output values (last hidden, logits) that are NaN or infinite in the candidate or the
    reference; ``max_abs_diff`` covers the finite ones only."""

    @property
    def ok(self) -> bool:
        """Top-k sets equal, every output finite and within ``OUTPUT_ATOL``."""
        return self.topk_equal and self.nonfinite == 0 and self.max_abs_diff <= OUTPUT_ATOL


def _finite_diff(a: Tensor, b: Tensor) -> tuple[float, int]:
    """``(max |a - b| over positions finite in both, count of positions that are not)``.

    NOTE: ``max(x, nan)`` is ``x`` in Python, so a NaN must be counted, never folded into
    the maximum.
    """
    finite = torch.isfinite(a) & torch.isfinite(b)
    diff = torch.where(finite, (a - b).abs(), torch.zeros_like(a))
    return float(diff.max()) if diff.numel() else 0.0, int((~finite).sum())


def max_abs_diff(a: Tensor, b: Tensor) -> float:
    """Largest ``|a - b|``; ``inf`` when either holds a NaN or an infinity anywhere."""
    diff, nonfinite = _finite_diff(a, b)
    return float("inf") if nonfinite else diff


def compare_batch(reference: BatchOutput, candidate: BatchOutput) -> BatchComparison:
    """Compares ``candidate`` with ``reference``; both must hold the same requests."""
    if [r.rid for r in reference.requests] != [r.rid for r in candidate.requests]:
        raise RuntimeError(
            f"batch {reference.batch}: request order differs between reference and candidate, "
            "indicates a bug in output collection"
        )
    max_diff = 0.0
    mismatches = nonfinite = 0
    for ref, got in zip(reference.requests, candidate.requests, strict=True):
        for a, b in ((ref.last_hidden, got.last_hidden), (ref.logits, got.logits)):
            diff, bad = _finite_diff(a, b)
            max_diff, nonfinite = max(max_diff, diff), nonfinite + bad
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
        nonfinite=nonfinite,
    )


@dataclass(frozen=True, slots=True)
class ShadowMismatch:
    """A candidate path that differed from its fallback on a sampled batch."""

    phase: int
    max_abs_diff: float
    """Largest difference of what was compared (``inf`` when rows or top-k differ)."""
    what: str
    """What differed: ``outputs``, ``rows read`` or ``rows written``."""


@dataclass(frozen=True, slots=True)
class ShadowOutcome:
    """What the shadow comparison of one sampled batch found (identical on every rank)."""

    compared: tuple[int, ...]
    """Phases whose candidate path was compared with its fallback."""
    mismatches: tuple[ShadowMismatch, ...]
    seconds: float
    """Wall time of the extra runs and comparisons on this rank."""


@dataclass(frozen=True, slots=True)
class StepOutput:
    """What the run step computes on this rank, on the run device."""

    topk: Tensor  # [num_layers, n_local, index_topk] logical key positions
    last_hidden: Tensor  # [bs, hidden] final-normed, identical on every rank
    logits: Tensor  # [bs, vocab]


@dataclass(frozen=True, slots=True)
class Served:
    """The path whose results a batch delivers, and the shadow comparison that chose it."""

    host: HostPlan
    tensors: BatchTensors
    step: StepOutput
    shadow: ShadowOutcome | None = None


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
    shadow: ShadowOutcome | None = None  # set on sampled batches only
    exposed_materialize_seconds: float = 0.0
    """Host time of this batch's view reads that no compute overlapped (``HistoryViews``)."""


def merge_rank_outputs(batch: BatchSpec, outputs: Sequence[RankBatchOutput]) -> BatchOutput:
    """Assembles every rank's piece of a batch into one ``BatchOutput`` in batch order.

    Every rank computes the last-token outputs from the same gathered states, so they must
    agree bitwise; a disagreement is a bug in collection and raises RuntimeError.
    """
    first = outputs[0]
    for other in outputs[1:]:
        if not (
            _same_bits(first.last_hidden, other.last_hidden)
            and _same_bits(first.logits, other.logits)
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


def _same_bits(a: Tensor, b: Tensor) -> bool:
    """Bitwise equality: a NaN every rank computed alike is the same output, and is left to
    ``compare_batch`` to fail (``torch.equal`` would call it a collection bug)."""
    return a.shape == b.shape and torch.equal(a.view(torch.int32), b.view(torch.int32))


def stack_topk(per_layer: list[Tensor]) -> Tensor:
    """``[num_layers, n, topk]`` from one ``[n, topk]`` tensor per layer."""
    return torch.stack(per_layer, dim=0)
