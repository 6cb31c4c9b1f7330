"""The ``rollback`` figure of ``cpkv bench``: saved bytes exact, times positive."""

from __future__ import annotations

from collections import Counter

import pytest

from cpkv.bench.rollback import LEVELS, rollback_figure
from cpkv.run.loop import HostLoop
from cpkv_core.config import IndexKDtype, model_preset
from cpkv_core.planning import BatchSpec, RequestSpec, pages_for_trace
from phases import PhaseId, level_enabled
from tests.conftest import make_deploy, tiny_row_bytes

TINY = model_preset("tiny")
BATCHES = (
    BatchSpec(0, (RequestSpec("a", 0, 13), RequestSpec("b", 0, 8))),
    BatchSpec(1, (RequestSpec("a", 13, 5), RequestSpec("c", 0, 16))),
)
"""New requests, then a continuation that resumes in a partly filled page beside a new one."""


def rows_by_owner(level: int, cp_size: int, page_size: int) -> list[list[int]]:
    """Per batch, the tokens each rank stores at ``level``: all of them when replicated
    (level 0), else those of the pages it owns (``page % cp_size``)."""
    deploy = make_deploy(cp_size=cp_size, page_size=page_size)
    num_pages = pages_for_trace(BATCHES, page_size, cp_size)
    loop = HostLoop(deploy, level_enabled(level, frozenset(PhaseId)), num_pages)
    expected = []
    for batch in BATCHES:
        scheduled = loop.step(batch).scheduled
        if level == 0:
            expected.append([scheduled.num_tokens] * cp_size)
            continue
        owners = Counter(
            int(req.page_table[pos // page_size]) % cp_size
            for req in scheduled.requests
            for pos in range(req.prefix_len, req.seq_len)
        )
        expected.append([owners[rank] for rank in range(cp_size)])
    return expected


@pytest.mark.parametrize("dtype", list(IndexKDtype))
def test_saved_bytes_are_the_rows_each_rank_writes(dtype: IndexKDtype) -> None:
    deploy = make_deploy(cp_size=2, page_size=4, index_k_dtype=dtype)
    figure = rollback_figure(TINY, deploy, BATCHES, repeats=1)
    assert figure.levels == list(LEVELS)
    assert figure.row_bytes == tiny_row_bytes(dtype)
    for level in LEVELS:
        rows = rows_by_owner(level, 2, 4)
        measured = figure.level_rows(level)
        assert [list(r.saved_rows_by_rank) for r in measured] == rows, level
        assert [list(r.saved_bytes_by_rank) for r in measured] == [
            [n * tiny_row_bytes(dtype) for n in per_rank] for per_rank in rows
        ], level
        assert [sum(r) for r in rows] == [
            b.num_tokens if level else b.num_tokens * 2 for b in BATCHES
        ]


def test_json_has_positive_ratios_and_the_headline() -> None:
    figure = rollback_figure(TINY, make_deploy(cp_size=2, page_size=4), BATCHES, repeats=1)
    doc = figure.to_json()
    assert doc["repeats"] == 5  # at least 5 timed saves
    assert isinstance(doc["save_over_step"], float) and doc["save_over_step"] > 0
    assert [lv["level"] for lv in doc["levels"]] == list(LEVELS)
    per_batch = [max(b["saved_bytes_by_rank"]) for lv in doc["levels"] for b in lv["batches"]]
    assert doc["saved_bytes_per_batch"] == pytest.approx(sum(per_batch) / len(per_batch))
    for level in doc["levels"]:
        assert level["saved_bytes"] == sum(sum(b["saved_bytes_by_rank"]) for b in level["batches"])
        for row in level["batches"]:
            assert row["save_seconds"] > 0 and row["step_seconds"] > 0
            assert row["save_over_step"] == pytest.approx(row["save_seconds"] / row["step_seconds"])
            assert 0 < row["save_over_step"] < 1
