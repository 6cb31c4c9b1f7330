"""PD re-shard index math, in process: every prefill rank's pieces for every decode rank
(cp N to dcp M), the descriptors they merge into, and their unpacking on each decode rank."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv_core.pd.pack import pack_index, pack_rows
from cpkv_core.pd.protocol import Piece
from cpkv_core.pd.receive import tiling_error, unpack_pieces
from cpkv_core.planning.pd_pack import completed_pages, page_runs, sender_first_rows, token_rows
from cpkv_core.planning.pd_reshard import (
    NOT_OWNED,
    ReshardPiece,
    decode_first_rows,
    decode_pages_per_rank,
    decode_positions,
    decode_tokens,
    merge_runs,
    pair_tokens,
    reshard_pieces,
)

Writes = dict[tuple[int, int], list[ReshardPiece]]
"""``(prefill rank, decode rank)``: the pieces, in order."""


def stream(
    table: list[int],
    seq_len: int,
    chunk_ends: list[int],
    page_size: int,
    sizes: tuple[int, int],
    token_bytes: int,
    capacity: int,
) -> Writes:
    """Every prefill rank's writes to every decode rank, step by step, as ``PdSender``
    plans them (``sizes``: cp N, dcp M)."""
    cp_size, dcp_size = sizes
    writes: Writes = {(a, b): [] for a in range(cp_size) for b in range(dcp_size)}
    sent_upto, cursors = 0, (0,) * dcp_size
    for end in chunk_ends:
        stop = completed_pages(end, page_size, final=end == seq_len)
        if stop <= sent_upto:
            continue
        seen = set()
        for rank in range(cp_size):
            pieces, next_cursors = reshard_pieces(
                np.asarray(table),
                sent_upto,
                stop,
                seq_len,
                page_size,
                cp_size,
                rank,
                dcp_size,
                token_bytes,
                cursors,
                capacity,
            )
            for piece in pieces:
                writes[rank, piece.dest].append(piece)
            seen.add(next_cursors)
        assert len(seen) == 1, seen  # every prefill rank computes the same slab layout
        sent_upto, cursors = stop, seen.pop()
    assert sent_upto == len(table)
    slabs = [decode_tokens(seq_len, page_size, b, dcp_size) * token_bytes for b in range(dcp_size)]
    assert list(cursors) == slabs  # each decode rank's slab is filled to its end
    return writes


@settings(max_examples=80, deadline=None)
@given(
    cp_size=st.integers(1, 4),
    dcp_size=st.integers(1, 4),
    page_size=st.sampled_from([1, 4, 16]),
    seq_len=st.integers(1, 120),
    sharded=st.booleans(),
    widths=st.lists(st.integers(1, 12), min_size=1, max_size=6),
    capacity_pages=st.integers(1, 5),
    data=st.data(),
)
def test_every_owned_page_goes_once_to_its_decode_owner_and_unpacks_byte_for_byte(
    cp_size: int,
    dcp_size: int,
    page_size: int,
    seq_len: int,
    sharded: bool,
    widths: list[int],
    capacity_pages: int,
    data: st.DataObject,
) -> None:
    """cp N to dcp M, N and M in 1..4, streamed in random chunks: every page position is
    written exactly once, by its prefill owner (``page % N``), to its decode owner
    (``position % M``) and no other; each decode rank's pieces tile its slab exactly, fit
    the staging buffer, and unpack into its pool at its own pages byte for byte."""
    pages = -(-seq_len // page_size)
    table = data.draw(st.lists(st.integers(0, 199), min_size=pages, max_size=pages, unique=True))
    cuts = data.draw(st.lists(st.integers(1, seq_len), max_size=4))
    token_bytes, capacity = sum(widths), capacity_pages * page_size * sum(widths)
    writes = stream(
        table,
        seq_len,
        sorted({*cuts, seq_len}),
        page_size,
        (cp_size, dcp_size),
        token_bytes,
        capacity,
    )
    sent = sorted(int(j) for pieces in writes.values() for p in pieces for j in p.positions)
    assert sent == list(range(pages))
    for (rank, dest), pieces in writes.items():
        for piece in pieces:
            assert all(table[j] % cp_size == rank and j % dcp_size == dest for j in piece.positions)
    gen = torch.Generator().manual_seed(seq_len)
    pool_pages = -(-200 // cp_size) if sharded else 200
    pools = [
        [
            torch.randint(0, 256, (pool_pages * page_size, w), dtype=torch.uint8, generator=gen)
            for w in widths
        ]
        for _ in range(cp_size)
    ]
    first_rows = sender_first_rows(np.asarray(table), page_size, cp_size, sharded)
    for dest in range(dcp_size):
        slab = torch.zeros(
            decode_tokens(seq_len, page_size, dest, dcp_size) * token_bytes, dtype=torch.uint8
        )
        landed = []
        for rank in range(cp_size):
            for piece in writes[rank, dest]:
                rows = token_rows(first_rows, piece.positions, seq_len, page_size)
                block = torch.zeros(len(rows) * token_bytes, dtype=torch.uint8)
                assert len(block) <= capacity
                pack_rows(pools[rank], pack_index(page_runs(rows, page_size), "cpu"), block)
                slab[piece.offset : piece.offset + len(block)] = block
                landed.append(Piece(piece.offset, tuple(int(j) for j in piece.positions)))
        mine = decode_positions(pages, dest, dcp_size)
        assert sorted(j for p in landed for j in p.positions) == mine.tolist()
        assert tiling_error(landed, len(slab), seq_len, page_size, token_bytes) == ""
        local_table = np.asarray(data.draw(st.permutations(range(len(mine)))), dtype=np.int64)
        decode_rows = decode_first_rows(local_table, pages, page_size, dest, dcp_size)
        assert (decode_rows == NOT_OWNED).sum() == pages - len(mine)
        pool = [torch.zeros(max(1, len(mine)) * page_size, w, dtype=torch.uint8) for w in widths]
        unpack_pieces(pool, slab, landed, decode_rows, seq_len, page_size)
        for k, j in enumerate(mine.tolist()):
            owner, n = table[j] % cp_size, min(page_size, seq_len - j * page_size)
            src, dst = int(first_rows[j]), int(local_table[k]) * page_size
            for want, got in zip(pools[owner], pool, strict=True):
                assert torch.equal(got[dst : dst + n], want[src : src + n])


def test_pieces_of_each_step_land_in_rank_order_after_earlier_steps() -> None:
    """docs/pd.md's examples: cp 2, page 4, 2 bytes a token, a page table ``[0, 1, 2, 3]``,
    15 tokens in chunks of 9 and 6; to one decode rank, then to two."""
    one = stream([0, 1, 2, 3], 15, [9, 15], 4, (2, 1), 2, 1 << 20)
    assert {k: [(p.offset, p.positions.tolist()) for p in v] for k, v in one.items()} == {
        (0, 0): [(0, [0]), (16, [2])],
        (1, 0): [(8, [1]), (24, [3])],
    }
    two = stream([0, 1, 2, 3], 15, [9, 15], 4, (2, 2), 2, 1 << 20)
    assert {k: [(p.offset, p.positions.tolist()) for p in v] for k, v in two.items()} == {
        (0, 0): [(0, [0]), (8, [2])],
        (0, 1): [],
        (1, 0): [],
        (1, 1): [(0, [1]), (8, [3])],
    }


def test_pairs_follow_both_owners_when_n_and_m_differ() -> None:
    """cp 4 to dcp 2, page table ``[5, 2, 7, 4, 0, 3]``, page 1: prefill owners
    ``[1, 2, 3, 0, 0, 3]``, decode owners ``[0, 1, 0, 1, 0, 1]``."""
    pairs = pair_tokens(np.asarray([5, 2, 7, 4, 0, 3]), 0, 6, 6, 1, 4, 2)
    assert pairs.tolist() == [[1, 1], [1, 0], [0, 1], [1, 1]]


@settings(max_examples=100, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 50), min_size=0, max_size=12),
    gaps=st.data(),
)
def test_merged_descriptors_cover_the_same_bytes(lengths: list[int], gaps: st.DataObject) -> None:
    """Descriptors packed side by side in staging, landing at destinations that sometimes
    continue the previous one: the merged ones map every source byte to the same destination
    byte, and no two merged neighbours could merge further."""
    srcs = np.cumsum([0, *lengths[:-1]]).astype(np.int64) if lengths else np.zeros(0, np.int64)
    skips = gaps.draw(
        st.lists(st.sampled_from([0, 0, 3, 100]), min_size=len(lengths), max_size=len(lengths))
    )
    dsts, at = [], 1000
    for length, skip in zip(lengths, skips, strict=True):
        at += skip
        dsts.append(at)
        at += length
    dsts_np, lengths_np = np.asarray(dsts, dtype=np.int64), np.asarray(lengths, dtype=np.int64)
    starts, counts, merged = merge_runs(srcs, dsts_np, lengths_np)
    assert int(counts.sum()) == len(lengths) and int(merged.sum()) == int(lengths_np.sum())
    want = {
        int(s) + i: int(d) + i
        for s, d, n in zip(srcs, dsts_np, lengths_np, strict=True)
        for i in range(n)
    }
    got = {
        int(srcs[s]) + i: int(dsts_np[s]) + i
        for s, n in zip(starts, merged, strict=True)
        for i in range(int(n))
    }
    assert got == want
    ends = [
        (int(srcs[s]) + int(n), int(dsts_np[s]) + int(n))
        for s, n in zip(starts, merged, strict=True)
    ]
    for (src_end, dst_end), nxt in zip(ends[:-1], starts[1:], strict=True):
        assert (src_end, dst_end) != (int(srcs[nxt]), int(dsts_np[nxt]))
    assert len(starts) == (1 + sum(skip > 0 for skip in skips[1:]) if lengths else 0)


def test_decode_pages_per_rank_counts_the_busiest_rank_and_the_decode_token() -> None:
    # 8 tokens + 1 = 3 pages of 4 (ranks 0, 1, 0), 3 tokens + 1 = 1 page (rank 0)
    assert decode_pages_per_rank([8, 3], 4, 2) == 2 + 1
    assert decode_pages_per_rank([8, 3], 4, 1) == 3 + 1
