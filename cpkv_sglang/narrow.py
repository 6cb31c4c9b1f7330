"""Phase 1's tail gather in SGLang: each CP rank contributes ``[bs, hidden]`` (the last-token
states it computed, zeros for the others) to one all-gather over SGLang's attention-CP
group, and each request's row is read from its last token's rank (:func:`narrow_gather`).
It moves ``cp_size x bs x hidden`` instead of the ``cp_size x max_rank_rows x hidden`` of
``cp_gather_after_forward``.

The shadow (:func:`last_rows_of_full`) picks the same rows out of the stock gather, as
``LogitsProcessor._get_pruned_states`` does, so the two compare bit for bit.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from cpkv_sglang.last_rows import LastTokenPlaces, last_token_places

__all__ = ["last_rows_of_full", "narrow_gather", "places_of"]


def places_of(forward_batch: Any, kind: str, cp_size: int, rank: int) -> LastTokenPlaces:
    """Each request's last-token place for this forward batch's CP metadata."""
    meta = forward_batch.attn_cp_metadata
    return last_token_places(
        kind,
        list(forward_batch.extend_seq_lens_cpu),
        cp_size,
        rank,
        getattr(meta, "split_list", None),
        getattr(meta, "zigzag_index", None),
    )


def narrow_gather(x: Tensor, places: LastTokenPlaces, cp_size: int) -> Tensor:
    """``[bs, hidden]``: every request's last-token state, the same on every rank.

    Args:
        x: ``[local_rows, hidden]`` this rank's hidden states (padding rows at the end).
        places: from :func:`places_of`.
    """
    from sglang.srt.layers.dp_attention import attn_cp_all_gather_into_tensor

    bs = len(places.owners)
    contribution = x.new_zeros((bs, *x.shape[1:]))
    if places.mine:
        mine = torch.tensor(places.mine, dtype=torch.long, device=x.device)
        rows = torch.tensor(places.local_rows, dtype=torch.long, device=x.device)
        contribution.index_copy_(0, mine, x.index_select(0, rows))
    gathered = x.new_empty((cp_size * bs, *x.shape[1:]))
    attn_cp_all_gather_into_tensor(gathered, contribution)
    picks = [owner * bs + i for i, owner in enumerate(places.owners)]
    return gathered.index_select(0, torch.tensor(picks, dtype=torch.long, device=x.device))


def last_rows_of_full(full: Tensor, extend_lens: list[int]) -> Tensor:
    """``[bs, hidden]``: the rows ``_get_pruned_states`` keeps from the stock gather (each
    request's last token, ``cumsum(extend_seq_lens) - 1``)."""
    lens = torch.tensor(extend_lens, dtype=torch.long, device=full.device)
    return full.index_select(0, torch.cumsum(lens, dim=0) - 1)
