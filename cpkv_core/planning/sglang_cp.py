"""SGLang 0.5.23's per-batch CP rules as integer math: whether a batch is split at all, and
how many rows each rank puts into a CP all-gather.

Read from the ``sglang==0.5.23`` wheel (paths inside it):

- ``srt/layers/cp/utils.py`` ``is_cp_active`` (lines 121-135): a batch runs CP only when a
  strategy exists, its forward mode is extend or mixed, and the strategy's
  ``can_apply(len(input_ids), forward_batch)`` holds. ``base.py`` ``init_cp_strategy``
  (lines 267-299) makes no strategy at ``cp_size <= 1``: a one-rank group never runs CP.
- ``srt/layers/cp/zigzag.py`` ``ZigzagCPStrategy.can_apply`` (lines 109-119): no split when
  ``cp_size <= 1``, when the batch has fewer than ``2 * cp_size`` tokens, or when any
  request's ``extend_seq_lens_cpu`` entry (its current tokens; a cached prefix or earlier
  chunk does not count) is below ``2 * cp_size``. The batch check is implied by the
  per-request one, since a batch has at least one request.
- ``srt/layers/cp/interleave.py`` ``InterleaveCPStrategy.can_apply`` (lines 170-175): split
  only when the batch's current tokens (the sum of ``extend_seq_lens_cpu``) are > 0 and
  ``>= cp_size``, and ``cp_size > 1``.
- Padding: ``utils.py`` ``prepare_cp_forward`` (line 167) calls ``padding.py``
  ``pad_logical_token_to_physical`` (lines 34-43) for every CP batch, which rounds the
  largest rank's row count up to a multiple of ``get_cp_padding_align_size()`` (lines
  24-31: ``2 * cp_size`` for zigzag, ``cp_size`` for interleave) as every rank's physical
  length. Interleave's all-gather (``interleave.py`` ``_gather_interleaved_tensor``, lines
  301-317) sends that physical length from every rank. Zigzag's
  (``zigzag.py`` ``_all_gather_reorganized``, lines 460-488) trims each rank to its logical
  rows and pads only to the largest logical count, so zigzag's alignment stays in the local
  compute rows and never reaches the gather.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cpkv_core.config import CpMode
from cpkv_core.planning.execution import SplitStrategy

__all__ = ["SglangDecline", "gather_rows_per_rank", "sglang_declines"]


@dataclass(frozen=True, slots=True)
class SglangDecline:
    """Why SGLang 0.5.23 runs a batch without CP: too few current tokens for the mode."""

    request: int | None
    """Zigzag: index of the first request with too few current tokens. Interleave: None
    (the rule counts the whole batch)."""
    tokens: int
    """Current tokens of that request (zigzag) or of the batch (interleave)."""
    need: int
    """The fewest current tokens the mode splits: ``2 * cp_size`` or ``cp_size``."""


def sglang_declines(
    extend_lens: Sequence[int], cp_mode: CpMode, cp_size: int
) -> SglangDecline | None:
    """The reason SGLang 0.5.23 would not split a batch of ``extend_lens`` current tokens
    per request, or None when it would (O(requests); allocates only to decline).

    At ``cp_size`` 1 there is no CP strategy at all, so nothing is declined: the one rank
    computes every token either way.
    """
    if cp_size <= 1:
        return None
    if cp_mode is CpMode.IN_SEQ_SPLIT:
        need = 2 * cp_size
        if min(extend_lens, default=need) >= need:
            return None
        index = next(i for i, tokens in enumerate(extend_lens) if tokens < need)
        return SglangDecline(index, extend_lens[index], need)
    total = sum(extend_lens)
    if total < cp_size:
        return SglangDecline(None, total, cp_size)
    return None


def gather_rows_per_rank(max_local: int, split: SplitStrategy, cp_size: int) -> int:
    """Rows every rank contributes to the current-chunk (and full tail) all-gather, as
    SGLang 0.5.23 pads it, given the busiest rank's ``max_local`` rows.

    Round-robin (SGLang's interleave) rounds ``max_local`` up to a multiple of ``cp_size``;
    the zigzag splits pad only to ``max_local``; the ``none`` split gathers nothing.
    """
    if split is SplitStrategy.ROUND_ROBIN:
        return -(-max_local // cp_size) * cp_size
    return max_local
