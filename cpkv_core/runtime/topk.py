"""The indexer's top-k: each query's highest-scoring visible keys, ties broken by logical
position (:func:`select_topk`), as the reference and every CP level select them."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["NO_KEY", "SORT_KEYS", "select_topk"]

NO_KEY = -1
"""Top-k slot filler when a query has fewer causal keys than ``index_topk``."""
SORT_KEYS = 256
"""Up to this many keys ``select_topk`` sorts them; past it, it finds the k-th score first."""


def select_topk(scores: Tensor, query_positions: Tensor, topk: int) -> Tensor:
    """Causal top-k key positions per query, ties broken by logical position.

    Keys are the request's positions ``0..num_keys-1`` (the logical page-table domain);
    a key is visible to a query at position ``p`` when its position is ``<= p``.

    Args:
        scores: ``[nq, num_keys]`` fp64 indexer logits.
        query_positions: ``[nq]`` logical positions of the queries.
        topk: keys to select.

    Returns:
        ``[nq, topk]`` int64 key positions in ascending order, ``NO_KEY`` padding at the end.
    """
    nq, num_keys = scores.shape
    width = max(num_keys, topk)
    if width > num_keys:
        scores = torch.cat([scores, scores.new_full((nq, width - num_keys), float("-inf"))], 1)
    key_positions = torch.arange(width, device=scores.device)
    visible = key_positions[None, :] <= query_positions[:, None]
    masked = scores.masked_fill(~visible, float("-inf"))
    if width <= SORT_KEYS:
        # NOTE: a stable descending sort keeps equal scores in logical key order, never by
        # memory layout; the slice below has a shape fixed by topk, not by the data.
        chosen = torch.sort(masked, dim=1, descending=True, stable=True).indices[:, :topk]
    else:
        chosen = _first_topk(masked, key_positions, topk)
    chosen = torch.where(torch.gather(visible, 1, chosen.clamp(max=width - 1)), chosen, width)
    chosen = torch.sort(chosen, dim=1).values
    return torch.where(chosen < width, chosen, NO_KEY)


def _first_topk(masked: Tensor, key_positions: Tensor, topk: int) -> Tensor:
    """The ``topk`` positions a row that a stable descending sort of ``masked [nq, width]`` puts
    first, in no order: the scores above the k-th largest, then the earliest equal to it (a
    half to a fifth of the sort's time at 1,000-3,000 keys; fixed shapes, no host read)."""
    width = masked.shape[1]
    kth = torch.topk(masked, topk, dim=1, sorted=False).values.amin(dim=1, keepdim=True)
    above = masked > kth
    tied = masked == kth
    need = topk - above.sum(dim=1, keepdim=True)
    take = above | (tied & (tied.cumsum(dim=1) <= need))
    earliest_first = torch.topk(torch.where(take, width - key_positions, 0), topk, dim=1)
    return width - earliest_first.values
