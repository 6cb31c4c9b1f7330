"""Gathers by whole pages: ``page_runs`` cuts a PD piece's token rows into whole pool pages
and the rows after them, ``pack_rows`` / ``unpack_rows`` move exactly the rows a row-by-row
gather would, in the same block order, and a view's ``KVRows.select_pages`` selects what
``select`` of the pages' rows does."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv_core.pd.pack import pack_index, pack_rows, unpack_rows
from cpkv_core.planning.pd_pack import page_runs, sender_first_rows, token_rows
from cpkv_core.runtime.kv_pool import KVRows, page_rows

PAGE = 4
POOL_PAGES = 12
WIDTHS = (6, 2, 1)
"""Row bytes of three views, as latent, index K and scale."""


@st.composite
def piece_rows(draw: st.DrawFn) -> np.ndarray:
    """Rows as packing meets them: whole pages in any order, then a page's length of
    consecutive rows from any row, then stray rows (a partial page, rows of no page)."""
    pages = draw(st.lists(st.integers(0, POOL_PAGES - 1), max_size=6, unique=True))
    shifted = draw(st.lists(st.integers(0, (POOL_PAGES - 1) * PAGE), max_size=1))
    stray = draw(st.lists(st.integers(0, POOL_PAGES * PAGE - 1), max_size=2 * PAGE, unique=True))
    whole = [page * PAGE + t for page in pages for t in range(PAGE)]
    run = [start + t for start in shifted for t in range(PAGE)]  # a page's length, any start
    return np.asarray(whole + run + stray, dtype=np.int64)


@settings(max_examples=150, deadline=None)
@given(piece_rows())
def test_page_runs_give_back_the_rows_with_the_longest_whole_page_prefix(rows: np.ndarray) -> None:
    runs = page_runs(rows, PAGE)
    assert runs.rows().tolist() == rows.tolist()
    assert len(runs) == len(rows)
    rest = runs.rest
    if len(rest) >= PAGE:  # no further whole page was left in the rest
        first = int(rest[0])
        assert not (first % PAGE == 0 and rest[:PAGE].tolist() == list(range(first, first + PAGE)))


def test_owned_positions_are_whole_pages_but_the_partial_last_one() -> None:
    table = np.asarray([5, 2, 7, 4, 1], dtype=np.int64)
    first_rows = sender_first_rows(table, PAGE, 1, sharded=False)
    rows = token_rows(first_rows, np.asarray([0, 2, 4]), 4 * PAGE + 3, PAGE)
    runs = page_runs(rows, PAGE)
    assert runs.pages.tolist() == [5, 7]
    assert runs.rest.tolist() == [4, 5, 6]  # page 1's first three rows


@settings(max_examples=100, deadline=None)
@given(piece_rows(), st.integers(0, PAGE - 1), st.integers(0, 2**31 - 1))
def test_pack_and_unpack_move_the_rows_a_row_by_row_gather_moves(
    rows: np.ndarray, extra_rows: int, seed: int
) -> None:
    """``extra_rows``: views whose rows end inside a page (a pool's are whole pages)."""
    gen = torch.Generator().manual_seed(seed)
    views = [
        torch.randint(0, 256, (POOL_PAGES * PAGE + extra_rows, w), dtype=torch.uint8, generator=gen)
        for w in WIDTHS
    ]
    index = pack_index(page_runs(rows, PAGE), "cpu")
    block = torch.zeros(len(rows) * sum(WIDTHS), dtype=torch.uint8)
    pack_rows(views, index, block)
    rows_t = torch.from_numpy(rows)
    assert torch.equal(block, torch.cat([v.index_select(0, rows_t).reshape(-1) for v in views]))

    if len(set(rows.tolist())) == len(rows):  # a scatter to repeated rows has no one answer
        landed = [torch.zeros_like(v) for v in views]
        unpack_rows(landed, index, block)
        for view, got in zip(views, landed, strict=True):
            expected = torch.zeros_like(view)
            expected[rows_t] = view[rows_t]
            assert torch.equal(got, expected)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, POOL_PAGES - 1), max_size=8), st.integers(0, 2**31 - 1))
def test_select_pages_is_select_of_the_pages_rows(pages: list[int], seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    n = POOL_PAGES * PAGE
    layer = KVRows(
        torch.randn(n, 6, generator=gen),
        torch.randn(n, 3, generator=gen).to(torch.float8_e4m3fn),
        torch.randn(n, generator=gen),
    )
    index = torch.tensor(pages, dtype=torch.int64)
    got = layer.select_pages(index, PAGE)
    want = layer.select(page_rows(index, PAGE))
    for field in ("latent", "index_k", "index_k_scale"):
        a, b = getattr(got, field), getattr(want, field)
        assert a.shape == b.shape  # bytes, so that NaN compares as itself
        assert torch.equal(a.contiguous().view(torch.uint8), b.view(torch.uint8))
