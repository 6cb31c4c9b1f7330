"""The decode step over KV sharded across decode CP ranks, in process (a ``LocalGroup`` of
M threads): each rank holds the page positions ``j % M`` of one request, merges top-k
candidates and attention partials with the others, and must equal the reference's decode
step: top-k sets exactly, outputs within ``OUTPUT_ATOL``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cpkv_core.config import IndexKDtype, model_preset
from cpkv_core.dist import Communicator, run_local
from cpkv_core.planning import BatchSpec, RequestSpec, Scheduler, token_ids
from cpkv_core.planning.pd_pack import token_rows
from cpkv_core.planning.pd_reshard import decode_positions
from cpkv_core.runtime import OUTPUT_ATOL, PagedKVPool, ReferenceModel, RequestOutput, max_abs_diff
from cpkv_core.runtime.dcp_decode import (
    NO_CANDIDATE,
    ShardKeys,
    dcp_decode_step,
    local_candidates,
    merge_candidates,
)
from cpkv_core.runtime.kv_pool import KVRows
from cpkv_core.runtime.topk import NO_KEY, select_topk

TINY = model_preset("tiny")
PAGE = 4


def _reference(
    seq_len: int, dtype: IndexKDtype
) -> tuple[ReferenceModel, list[KVRows], int, RequestOutput]:
    """The reference after prefilling ``seq_len`` tokens: its model, the rows by position of
    every layer, the decode token and the reference's decode step."""
    scheduler, reference = Scheduler(64, PAGE), ReferenceModel(TINY, 64, PAGE, dtype)
    with torch.no_grad():
        (req,) = scheduler.schedule(BatchSpec(0, (RequestSpec("r", 0, seq_len),))).requests
        reference.run_request(req)
        locs = reference.locs(req, 0, seq_len)
        rows = [reference.pool.read(layer, locs) for layer in range(TINY.num_layers)]
        (step,) = scheduler.schedule(BatchSpec(1, (RequestSpec("r", seq_len, 1),))).requests
        token = int(
            token_ids(torch.tensor(step.rid_key), torch.tensor([seq_len]), TINY.vocab_size)[0]
        )
        return reference, rows, token, reference.run_request(step)


def _sharded_step(
    comm: Communicator,
    reference: ReferenceModel,
    rows: list[KVRows],
    token: int,
    seq_len: int,
    dtype: IndexKDtype,
) -> RequestOutput:
    """Decode rank ``comm.rank``: a pool of its own pages (its positions in order, the new
    token's page included when it owns it), filled from the reference's rows; one step."""
    rank, size = comm.rank, comm.world_size
    pages = -(-(seq_len + 1) // PAGE)
    mine = decode_positions(pages, rank, size)
    positions = torch.from_numpy(token_rows(np.arange(pages) * PAGE, mine, seq_len + 1, PAGE))
    pool = PagedKVPool(TINY, len(mine) + 1, PAGE, dtype)
    # NOTE: local pages in reverse order: the rows a rank reads are its own, wherever they sit.
    local = torch.arange(len(positions))
    locs = (len(mine) - 1 - local // PAGE) * PAGE + local % PAGE
    old = positions < seq_len
    for layer, r in enumerate(rows):
        stored = r.select(positions[old])
        pool.write(layer, locs[old], stored)
    new_loc = int(locs[~old][0]) if bool((~old).any()) else None
    with torch.no_grad():
        keys = ShardKeys(locs, positions)
        return dcp_decode_step(
            TINY, reference.weights, pool, comm, ("r", token, seq_len), keys, new_loc, dtype
        )


@pytest.mark.parametrize(
    ("seq_len", "dtype"),
    [(n, IndexKDtype.FP8_E4M3) for n in (1, 4, 5, 16, 17, 45)] + [(17, IndexKDtype.FP32)],
)
def test_sharded_decode_step_equals_the_reference(seq_len: int, dtype: IndexKDtype) -> None:
    """M = 1..4 decode ranks; lengths below the top-k (16), at page boundaries +-1 and a
    longer one; a rank may hold no key at all (M > pages), or only the new token."""
    reference, rows, token, want = _reference(seq_len, dtype)
    for size in (1, 2, 3, 4):
        outs = run_local(size, lambda c: _sharded_step(c, reference, rows, token, seq_len, dtype))
        for rank, got in enumerate(outs):
            assert torch.equal(got.topk, want.topk), (size, rank, got.topk, want.topk)
            diff = max(
                max_abs_diff(got.last_hidden, want.last_hidden),
                max_abs_diff(got.logits, want.logits),
            )
            assert diff <= OUTPUT_ATOL, (size, rank, diff)


def test_merged_candidates_break_ties_by_lower_position_across_ranks() -> None:
    """Equal scores on two ranks: the global top-k keeps the lower positions, as the
    reference's stable sort over positions does."""
    scores = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.5, 1.0], dtype=torch.float64)
    positions = torch.arange(6)
    want = select_topk(scores[None, :], torch.tensor([5]), 2)[0]
    # rank 0 holds positions 0, 2, 4 and rank 1 positions 1, 3, 5: rank order is not
    # position order
    by_rank = [local_candidates(scores[r::2], positions[r::2], 2) for r in range(2)]
    got = merge_candidates(
        torch.stack([s for s, _ in by_rank]), torch.stack([p for _, p in by_rank]), 2
    )
    assert got.tolist() == want.tolist() == [0, 1]


def test_fewer_keys_than_top_k_pad_with_no_key_at_the_end() -> None:
    best, where = local_candidates(
        torch.tensor([0.3, 0.1], dtype=torch.float64), torch.tensor([4, 9]), 4
    )
    assert where.tolist() == [4, 9, NO_CANDIDATE, NO_CANDIDATE]
    empty = local_candidates(
        torch.zeros(0, dtype=torch.float64), torch.zeros(0, dtype=torch.int64), 4
    )
    got = merge_candidates(torch.stack([best, empty[0]]), torch.stack([where, empty[1]]), 4)
    assert got.tolist() == [4, 9, NO_KEY, NO_KEY]
