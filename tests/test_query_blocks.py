"""The indexer's query blocks: each block's keys are exactly the causal keys of its last
query, whatever the split, and scoring block by block gives the bits of one call."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv_core.config import CpMode, IndexKDtype, model_preset
from cpkv_core.planning import SplitStrategy, build_host_plan
from cpkv_core.planning.query_blocks import (
    QueryBlock,
    contiguous_query_blocks,
    split_query_blocks,
)
from cpkv_core.planning.segments import build_segments
from cpkv_core.runtime import expand
from cpkv_core.runtime.device_plan import upload
from cpkv_core.runtime.model import indexer_topk, project
from cpkv_core.runtime.weights import init_weights
from tests.conftest import make_deploy, mixed_trace
from tests.test_segments import tokens_of_rank
from tests.test_sharded_kv import loop_steps

TINY = model_preset("tiny")
WEIGHTS = init_weights(TINY)


def assert_blocks_fit(blocks: tuple[QueryBlock, ...], positions: list[int], most: int) -> None:
    """The blocks tile the rows in order, at most ``most`` each, and each sees exactly the
    keys up to its last query's position."""
    assert [b.start for b in blocks] == [0, *(b.end for b in blocks[:-1])], blocks
    assert blocks[-1].end == len(positions)
    for block in blocks:
        assert 0 < block.end - block.start <= most, block
        assert block.num_keys == positions[block.end - 1] + 1, (block, positions)
        assert max(positions[block.start : block.end]) < block.num_keys


@settings(max_examples=150, deadline=None)
@given(
    requests=st.lists(st.tuples(st.integers(0, 30), st.integers(1, 60)), min_size=1, max_size=5),
    cp_size=st.integers(1, 4),
    strategy=st.sampled_from([SplitStrategy.ZIGZAG, SplitStrategy.ROUND_ROBIN, SplitStrategy.NONE]),
    block_rows=st.integers(1, 9),
)
def test_blocks_see_the_causal_keys_of_their_last_query(
    requests: list[tuple[int, int]], cp_size: int, strategy: SplitStrategy, block_rows: int
) -> None:
    prefix = [p for p, _ in requests]
    extend = [e for _, e in requests]
    segs = build_segments(strategy, extend, prefix, cp_size, 4)
    cu_extend = np.concatenate([[0], np.cumsum(extend)])
    for rank in range(cp_size):
        tokens = tokens_of_rank(segs, rank)
        lo, hi = (int(i) for i in np.searchsorted(segs.rank, [rank, rank + 1]))
        rows_of = [
            [row for row, g in enumerate(tokens) if first <= g < cu_extend[index + 1]]
            for index, first in enumerate(cu_extend[:-1].tolist())
        ]
        attended = [index for index, rows in enumerate(rows_of) if rows]
        for index in attended:
            rows = rows_of[index]
            assert rows == list(range(rows[0], rows[-1] + 1)), "a request's rows are a run"
        bounds = (
            np.asarray([rows_of[i][0] for i in attended], np.int64),
            np.asarray([rows_of[i][-1] + 1 for i in attended], np.int64),
        )
        picked = np.asarray(attended, np.int64)
        every = split_query_blocks(
            segs, lo, hi, bounds, cu_extend[picked], np.asarray(prefix)[picked], block_rows
        )
        assert len(every) == len(attended)
        for index, blocks in zip(attended, every, strict=True):
            first = int(cu_extend[index])
            positions = [prefix[index] + tokens[row] - first for row in rows_of[index]]
            assert_blocks_fit(blocks, positions, block_rows)


@pytest.mark.parametrize("cp_mode", list(CpMode))
@pytest.mark.parametrize("level", range(6))
def test_host_plans_block_every_attended_request(cp_mode: CpMode, level: int) -> None:
    """What ``build_host_plan`` hands the indexer fits the positions the run step expands."""
    deploy = make_deploy(3, 4, cp_mode)
    for step in loop_steps(deploy, level, mixed_trace(4).batches):
        for rank in range(3):
            host = build_host_plan(step.scheduled, step.decision.plan, rank)
            tensors = expand(host, upload(host, torch.device("cpu")), TINY.vocab_size)
            for req in host.attended:
                positions = tensors.local_positions[req.row_start : req.row_end].tolist()
                assert_blocks_fit(req.blocks, positions, 128)


def test_contiguous_blocks_cut_a_chunk_every_block_rows() -> None:
    blocks = contiguous_query_blocks(10, 7, block_rows=3)
    assert blocks == (QueryBlock(0, 3, 13), QueryBlock(3, 6, 16), QueryBlock(6, 7, 17))
    with pytest.raises(ValueError, match="at least 1 row"):
        contiguous_query_blocks(0, 4, block_rows=0)


@settings(max_examples=25, deadline=None)
@given(
    prefix=st.integers(0, 300),
    length=st.integers(1, 80),
    block_rows=st.integers(1, 20),
    dtype=st.sampled_from(list(IndexKDtype)),
    seed=st.integers(0, 2**16),
)
def test_indexer_block_by_block_gives_the_bits_of_one_call(
    prefix: int, length: int, block_rows: int, dtype: IndexKDtype, seed: int
) -> None:
    """Blocks whose keys are fewer than ``index_topk`` (padded slots) included, and more
    than ``SORT_KEYS`` (the top-k's other path)."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(prefix + length, TINY.hidden_size, generator=gen)
    proj = project(TINY, WEIGHTS.layers[0], hidden, dtype)
    queries = proj.between(prefix, prefix + length)
    positions = torch.arange(prefix, prefix + length)
    whole = indexer_topk(TINY, queries, positions, proj.index_k, proj.index_k_scale)
    blocks = contiguous_query_blocks(prefix, length, block_rows)
    blocked = indexer_topk(TINY, queries, positions, proj.index_k, proj.index_k_scale, blocks)
    assert torch.equal(blocked, whole)
