"""``cpkv bench --rows``: the bytes of every figure on the tiny grid, against counts made by
hand from the pages and splits of its batches; the measured scratch against the plan's. No
timing is asserted.

The tiny grid (page 16, cp 2): each request has 128 history tokens (8 pages) and the batch
256 current tokens. With bs 1 the request's 24 pages split 12/12 between the owners; with bs
2 each request has 8 current pages, and the shared-prefix twin's two requests read the same
8 history pages. A DeepSeek-V3.2 row is 1,152 + 132 = 1,284 B (bf16) or 656 + 132 = 788 B
(fp8_e4m3); a hidden state is 7,168 x 2 B.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import time
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from cpkv.bench.rows import ceiling as rows_ceiling
from cpkv.bench.rows import measure as bench_rows_measure
from cpkv.bench.rows import rounds as rows_rounds
from cpkv.bench.rows.group import RankAlone
from cpkv.bench.rows.ops import chunk_ops, replicated_ops, sharded_ops
from cpkv.bench.rows.setup import GRIDS, PointSetup, row_format
from cpkv.cli import app
from cpkv.plan.kv_bytes import KvCacheDtype
from cpkv_core.config import model_preset

PAGE, CP, HISTORY, CHUNK = 16, 2, 128, 256
HIDDEN_ROW = 7168 * 2
ROWS = {"auto": 1152 + 132, "fp8_e4m3": 656 + 132}


def expected_rows(bs: int, shared: bool) -> dict[tuple[str, str], int]:
    """Token rows (hidden rows for the tail) each op writes on rank 0, counted by hand.

    Every request's pages split evenly between the two owners (the page-aligned split deals
    each request's pages in 2 x cp_size segments), so the busiest owner holds half.
    """
    extend = CHUNK // bs
    history_pages, current_pages = HISTORY // PAGE, extend // PAGE
    reads = bs * (history_pages + current_pages)  # page-table entries of the batch
    distinct = (history_pages if shared else bs * history_pages) + bs * current_pages
    rows = {
        ("view", "slot"): (1 + CP) * (reads // CP) * PAGE,
        ("view", "unique"): (1 + CP) * (distinct // CP) * PAGE,
        ("view", "peer-read"): bs * HISTORY + CHUNK,
        ("view", "peer-read-unique"): (distinct - bs * current_pages) * PAGE + CHUNK,
    }
    if shared:
        return rows
    local = CHUNK // CP  # zigzag and page-aligned halves alike
    gathered = CP * local + CHUNK  # the all-gather's stack, then the batch-order select
    owned_current = bs * current_pages // CP * PAGE
    return rows | {
        ("write", "replicated"): gathered + CHUNK,
        ("write", "owner-filtered"): gathered + owned_current,
        ("write", "direct"): local,
        ("current-gather", "all-gather"): gathered,
        ("rollback-save", "replicated"): CHUNK,
        ("rollback-save", "owner-filtered"): owned_current,
        ("rollback-save", "direct"): owned_current,
        ("pd-pack", "owned-pages"): bs * (HISTORY + extend) // CP,
        # full: the all-gather, the batch-order select and the bs last rows
        ("tail", "full"): gathered + bs,
        # narrow: the zigzag puts every request's last token on rank 0, so its part is one
        # select of its bs last rows; then the gather and the pick
        ("tail", "narrow"): bs + CP * bs + bs,
    }


def run_rows(*args: str) -> Any:
    result = CliRunner().invoke(app, ["bench", "--rows", "deepseek-v3.2", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def tiny_bf16() -> Any:
    """One run of the tiny grid in two passes, each op timed once a pass (no extra rounds for
    short ops)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rows_rounds, "ROUND_BUDGET_S", 0.0)
        return run_rows("--rows-grid", "tiny", "--repeats", "1", "--rows-passes", "2", "--json")


def test_tiny_grid_is_the_one_the_expectations_count() -> None:
    grid = GRIDS["tiny"]
    assert (grid.page_size, grid.cp_sizes, grid.histories, grid.chunk) == (
        PAGE,
        (CP,),
        (HISTORY,),
        CHUNK,
    )


def test_every_figure_moves_the_bytes_counted_by_hand(tiny_bf16: Any) -> None:
    row = ROWS["auto"]
    seen = set()
    for entry in tiny_bf16["real_rows"]:
        point = (entry["bs"], entry["shared_prefix"])
        key = (entry["op"], entry["variant"])
        rows = expected_rows(*point)[key]
        width = HIDDEN_ROW if entry["op"] == "tail" else row
        assert entry["bytes"] == rows * width, (point, key, entry["bytes"] / width, rows)
        assert entry["gb_per_s"] == pytest.approx(entry["bytes"] / entry["seconds"] / 1e9)
        # NOTE: one round in each of the two passes, pooled.
        assert (entry["rounds"], entry["placements"]) == (2, 2), (point, key)
        assert entry["placement_rounds"] == [1, 1], (point, key)
        assert len(entry["op_rounds"]) == len(entry["copy_rounds"]) == 2
        seen.add((*point, *key))
    expected = {(*p, *k) for p in ((1, False), (2, False), (2, True)) for k in expected_rows(*p)}
    assert seen == expected


def test_the_run_copies_past_this_machines_last_level_cache(tiny_bf16: Any) -> None:
    """The bench's ceiling on this machine: both figures in the JSON, and every buffer
    past the cache sysfs reports (a 64 MiB pair ran from a shared 480 MiB L3 at times, at
    1.55x the memory rate)."""
    setup = tiny_bf16["real_rows_setup"]
    cache = rows_ceiling.last_level_cache_bytes(torch.device("cpu"))
    assert setup["last_level_cache_bytes"] == (cache or None)
    assert setup["copy_buffer_bytes"] == max(cache, rows_ceiling.CEILING_PIECE_BYTES)


def test_fp8_rows_are_656_plus_132_bytes() -> None:
    """The ops' byte counts (what the entries report) at fp8_e4m3, without timing them."""
    model = model_preset("deepseek-v3.2")
    fmt = row_format(model, KvCacheDtype.FP8_E4M3)
    assert fmt.row_bytes == ROWS["fp8_e4m3"]
    assert (fmt.latent.dtype, fmt.latent.width) == (torch.uint8, 656)
    grid = GRIDS["tiny"]
    for point in grid.points():
        setup = PointSetup(model, fmt, point, grid, "cpu")
        comm = RankAlone(0, point.cp_size)
        ops = [*sharded_ops(setup, comm, model.num_layers)]
        if not point.shared_prefix:
            ops += [*replicated_ops(setup, comm), *chunk_ops(setup)]
        expected = expected_rows(point.bs, point.shared_prefix)
        assert {(op.op, op.variant) for op in ops} == set(expected)
        for op in ops:
            width = HIDDEN_ROW if op.op == "tail" else ROWS["fp8_e4m3"]
            assert op.bytes == expected[(op.op, op.variant)] * width, (point, op.op, op.variant)


def test_view_scratch_is_what_the_plan_budgets(tiny_bf16: Any) -> None:
    """Balanced owners: the measured send slots and view equal ``cpkv plan``'s scratch."""
    views = [e for e in tiny_bf16["real_rows"] if e["op"] == "view" and not e["shared_prefix"]]
    assert len(views) == 8
    for entry in views:
        assert entry["scratch_bytes"] == entry["planned_scratch_bytes"] == entry["bytes"], entry
    direct = next(e for e in tiny_bf16["real_rows"] if e["variant"] == "direct")
    assert direct["op"] == "write" and direct["scratch_bytes"] == 0  # no gather of its rows


def test_unique_remap_wins_bytes_only_with_a_shared_prefix(tiny_bf16: Any) -> None:
    verdicts = tiny_bf16["slot_vs_unique"]
    assert {(v["bs"], v["shared_prefix"], v["read"]) for v in verdicts} == {
        (bs, shared, read)
        for bs, shared in ((1, False), (2, False), (2, True))
        for read in ("gather", "peer-read")
    }
    for v in verdicts:
        layers = tiny_bf16["real_rows_setup"]["num_layers"]
        assert layers == 61
        if v["shared_prefix"]:
            assert v["unique_bytes"] < v["slot_bytes"], v
        else:
            assert v["unique_bytes"] == v["slot_bytes"], v


def test_projection_has_every_level_of_every_point(tiny_bf16: Any) -> None:
    rows = tiny_bf16["real_rows_projection"]
    assert len(rows) == 2 * 3 * 6  # (bs 1, bs 2) x (slot, unique, peer-read) x levels 0..5
    own = {
        (e["bs"], e["op"], e["variant"]): e["bytes"]
        for e in tiny_bf16["real_rows"]
        if not e["shared_prefix"]
    }
    for r in rows:
        bs = r["bs"]
        if r["level"] == 0:
            per_layer = own[(bs, "write", "replicated")] + own[(bs, "rollback-save", "replicated")]
            assert r["bytes"] == 61 * per_layer + own[(bs, "tail", "full")]
            assert r["seconds_vs_level0"] == 0.0
        if r["level"] == 5 and r["read"] == "slot":
            per_layer = sum(
                own[(bs, op, variant)]
                for op, variant in (("write", "direct"), ("rollback-save", "direct"))
            )
            per_layer += own[(bs, "view", "slot")]
            assert r["bytes"] == 61 * per_layer + own[(bs, "tail", "narrow")]


def _touching(fresh_calls: set[int]) -> tuple[list[int], Any]:
    """A run that writes 4 MiB of memory never touched before on the calls numbered in
    ``fresh_calls`` (a new mapping: 1,024 page faults) and nothing on the others; it counts
    its calls."""
    calls: list[int] = []
    kept: list[mmap.mmap] = []

    def run() -> None:
        if len(calls) in fresh_calls:
            kept.append(mmap.mmap(-1, 4 << 20))
            torch.frombuffer(kept[-1], dtype=torch.uint8).fill_(1)
        calls.append(len(calls))

    return calls, run


def test_warm_up_waits_for_calls_in_a_row_without_page_faults() -> None:
    """A call without faults between faulting ones does not end the warm-up (glibc can
    place one call in held memory and the next in fresh memory again)."""
    calls, run = _touching({0, 1, 3})
    cpu = torch.device("cpu")
    rows_rounds.warm_up(run, 16 << 20, cpu)
    assert len(calls) == 4 + rows_rounds.SETTLED_CALLS


def test_timed_rounds_count_the_page_faults_they_take() -> None:
    cpu = torch.device("cpu")
    ceiling = rows_ceiling.CopyCeiling(cpu, piece_bytes=1 << 20, buffer_bytes=1 << 20)
    warm = rows_rounds.MAX_WARMUPS
    # NOTE: one faulting timed call: at least two rounds are asked for (repeats 2), so it is
    # set aside whatever the load makes of the rounds' count.
    calls, run = _touching(set(range(warm + 1)))
    faulting = rows_rounds.time_op(run, 16 << 20, ceiling, 2, cpu)
    assert faulting.page_faults >= (4 << 20) // bench_rows_measure.PAGE_BYTES
    assert faulting.faulted_rounds == 1
    assert len(calls) == warm + faulting.rounds + 1
    _, settled = _touching(set())
    clean = rows_rounds.time_op(settled, 16 << 20, ceiling, 2, cpu)
    assert clean.page_faults < 64 and clean.faulted_rounds == 0


def test_an_op_that_faults_every_call_is_timed_on_every_round() -> None:
    """Set-aside rounds are bounded: when the op faults in every call, as many extra rounds
    as asked for are run, and then every round counts (its faults are the figure)."""
    cpu = torch.device("cpu")
    ceiling = rows_ceiling.CopyCeiling(cpu, piece_bytes=1 << 20, buffer_bytes=1 << 20)
    calls, run = _touching(set(range(1000)))
    timing = rows_rounds.time_op(run, 16 << 20, ceiling, 2, cpu)
    assert timing.faulted_rounds == 0
    assert len(calls) == rows_rounds.MAX_WARMUPS + timing.rounds
    assert timing.page_faults >= timing.rounds * (4 << 20) // bench_rows_measure.PAGE_BYTES


def test_one_thread_rounds_are_timed_on_its_cpu_time() -> None:
    """A call that waits spends wall time and next to no CPU time: with one torch thread the
    rounds leave out the time the op is off the core (other processes holding it)."""
    cpu = torch.device("cpu")
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert rows_rounds.op_clock(cpu)[0] == "wall"
        torch.set_num_threads(1)
        name, clock = rows_rounds.op_clock(cpu)
    finally:
        torch.set_num_threads(threads)
    assert name == "thread-cpu"
    ceiling = rows_ceiling.CopyCeiling(cpu, piece_bytes=1 << 20, buffer_bytes=1 << 20)
    waits = rows_rounds.time_op(lambda: time.sleep(0.02), 1 << 20, ceiling, 2, cpu, clock)
    assert waits.wall_seconds >= 0.02 > waits.seconds


class _Mallinfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (2.33 and later): ten ``size_t`` counts."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd",
            "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


def _top_bytes() -> int | None:
    """The free bytes at the heap's top glibc holds (``keepcost``); None without glibc 2.33."""
    libc = bench_rows_measure._libc()  # NOTE: the libc the allocator tunes, found as it does
    if libc is None or not hasattr(libc, "mallinfo2"):
        return None
    libc.mallinfo2.restype = _Mallinfo2
    return int(libc.mallinfo2().keepcost)


def test_the_reusing_allocator_keeps_its_top_past_a_large_free() -> None:
    """After more than the 2 GiB trim threshold is freed at the heap's top, glibc still holds
    2 GiB there, from where the next tensors are taken without faults: without the top pad
    the free trimmed the top back to the system, and every later call faulted its tensors
    in again. (Read off glibc's count, not off faults: where a later tensor lands depends on
    the holes earlier tests in this process left.)"""
    cpu = torch.device("cpu")
    with bench_rows_measure.reusing_allocator(cpu) as allocator:
        if allocator != "caching" or _top_bytes() is None:
            pytest.skip("no glibc 2.33 to tell")
        large = torch.ones(int(2.1 * (1 << 30)), dtype=torch.uint8)  # touched: held memory
        del large
        top = _top_bytes()
    assert top is not None and top >= (2 << 30) - (1 << 20)


def test_the_copy_ceiling_takes_no_page_faults() -> None:
    """A copy that faulted its destination in would run slower than the ceiling is."""
    ceiling = rows_ceiling.CopyCeiling(
        torch.device("cpu"), piece_bytes=4 << 20, buffer_bytes=4 << 20
    )
    faults = bench_rows_measure.minor_faults()
    for _ in range(64):
        ceiling.copy(64 << 10)  # one pass over both buffers
    assert bench_rows_measure.minor_faults() - faults < 64


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--rows", "nope"], "unknown model preset 'nope'"),
        (["--rows", "glm-5", "--device", "meta"], "moves none"),
        (["--rows", "glm-5", "--rows-grid", "huge"], "--rows-grid 'huge'"),
        (["--rows", "glm-5", "--kv-cache-dtype", "fp4"], "kv_cache_dtype must be one of"),
        (["--rows", "glm-5", "--out", "plots"], "with --rows use --json"),
        (["--rows", "glm-5", "--rows-passes", "0"], "--rows-passes"),
    ],
)
def test_rows_refuses_bad_input_before_running(args: list[str], match: str) -> None:
    result = CliRunner().invoke(app, ["bench", *args])
    assert result.exit_code == 2, result.output
    assert match in result.stderr
