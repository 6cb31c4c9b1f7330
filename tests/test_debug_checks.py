"""Every ``SGLANG_DEBUG_CP_SHARED_KV`` check fires on the bug it guards, and the flag reaches
``verify``, ``demo`` and ``pd``."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

import cpkv.commands.shared as shared_mod
import cpkv.run.pd as pd_mod
from cpkv.cli import app
from cpkv.run.jobs import Backend, LevelRun, RankJob
from cpkv.run.verify import VerifyReport, verify_levels
from cpkv_core.config import model_preset
from cpkv_core.planning import BatchSpec
from cpkv_core.runtime import engine as engine_mod
from cpkv_core.runtime.debug_checks import DebugChecks
from cpkv_core.runtime.device_plan import BatchTensors, expand
from cpkv_core.runtime.kv_access import write_rows
from cpkv_core.runtime.kv_pool import KVRows, PagedKVPool
from cpkv_core.traces import parse_trace_text
from phases.registry import REGISTERED_PHASES
from tests.conftest import make_deploy, mixed_trace

TINY = model_preset("tiny")
ALL = frozenset(REGISTERED_PHASES)
runner = CliRunner()
CURRENT_ONLY = parse_trace_text(
    '{"batch": 0, "requests": [{"rid": "a", "prefix_len": 0, "extend_len": 13}, '
    '{"rid": "b", "prefix_len": 0, "extend_len": 6}]}',
    4,
).batches


def verify(batches: tuple[BatchSpec, ...], level: int, cp_size: int = 2) -> VerifyReport:
    return verify_levels(
        TINY, make_deploy(cp_size, 4), batches, (level,), ALL, Backend.LOCAL, debug_checks=True
    )


def run(batches: tuple[BatchSpec, ...], level: int, cp_size: int = 2) -> bool:
    return verify(batches, level, cp_size).ok


def drop_last_write(monkeypatch: pytest.MonkeyPatch) -> None:
    """The KV write loses its last token row (the plan still lists it)."""

    def dropping(pool: PagedKVPool, layer: int, source: KVRows, rows: Any, dest: Any) -> None:
        rows = torch.arange(len(dest), device=dest.device) if rows is None else rows
        write_rows(pool, layer, source, rows[:-1], dest[:-1])

    monkeypatch.setattr(engine_mod, "write_rows", dropping)


def drop_last_planned_write(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan forgets the last token row it should write (one row of a page)."""

    def forgetting(*args: Any, **kwargs: Any) -> BatchTensors:
        t = expand(*args, **kwargs)
        return dataclasses.replace(
            t,
            write_source=t.write_source_rows()[:-1],
            write_dest=t.write_dest[:-1],
            written_locs=t.written_locs[:-1],
        )

    monkeypatch.setattr(engine_mod, "expand", forgetting)


def test_checks_pass_on_correct_runs_at_every_level() -> None:
    batches = mixed_trace(4).batches
    for level in range(4):
        assert run(batches, level, cp_size=3), level


def test_written_check_catches_a_dropped_write_and_stops_the_run_in_phase_2(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Phase 3 reads the gathered chunk, not the pool: only a check against the owners'
    pools sees that a row never reached its owner. The write every strategy does is
    phase 2's at level 3, which a batch cannot drop: the run stops, named."""
    drop_last_write(monkeypatch)
    words = r"rows the batch computed differ from their owners' pools[\s\S]*phase 2's path"
    with pytest.raises(RuntimeError, match=words):
        run(CURRENT_ONLY, level=3)


def test_written_check_catches_a_write_that_corrupts_only_the_index_k_scale(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The latent and index K land right, the scale of the last row does not: a row is
    its three parts, so the check against the owners' pools must see it."""

    def bad_scale(pool: PagedKVPool, layer: int, source: KVRows, rows: Any, dest: Any) -> None:
        rows_in = source if rows is None else source.select(rows)
        scale = rows_in.index_k_scale.clone()
        scale[-1:] *= 2.0
        write_rows(pool, layer, KVRows(rows_in.latent, rows_in.index_k, scale), None, dest)

    monkeypatch.setattr(engine_mod, "write_rows", bad_scale)
    words = r"rows the batch computed differ from their owners' pools[\s\S]*phase 2's path"
    with pytest.raises(RuntimeError, match=words):
        run(CURRENT_ONLY, level=3)


def test_view_check_catches_a_dropped_write_in_a_current_only_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the written check off, the view check still sees the row missing from its
    owner's pool; it blames the read, so phase 3 is killed and the batch rerun."""
    drop_last_write(monkeypatch)
    monkeypatch.setattr(DebugChecks, "check_written", lambda *args: None)
    report = verify(CURRENT_ONLY, level=3)
    assert report.failures is not None
    (kill,) = [k.kill for k in report.failures.kills]
    assert (kill.phase, kill.cause, kill.points) == (3, "debug_check", ("kv_read",))
    assert re.search(r"key rows read \(current\) differ from their owners", kill.message)


def test_view_check_catches_a_wrong_history_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """Position 0 of a request with a prefix reads position 1's row: history only."""

    def stale_history(plan: Any, packed: Any, vocab: int) -> BatchTensors:
        t = expand(plan, packed, vocab)
        first = plan.attended[0] if plan.attended else None
        if first is None or int(plan.table("prefix_lens")[first.index]) == 0:
            return t
        key_rows = t.key_rows.clone()
        key_rows[first.key_start] = key_rows[first.key_start + 1]
        return dataclasses.replace(t, key_rows=key_rows)

    monkeypatch.setattr(engine_mod, "expand", stale_history)
    with pytest.raises(RuntimeError, match=r"key rows read \(view\) differ"):
        run(mixed_trace(4).batches, level=2)


def test_write_check_catches_a_write_to_a_foreign_page(monkeypatch: pytest.MonkeyPatch) -> None:
    def next_page(*args: Any, **kwargs: Any) -> BatchTensors:
        t = expand(*args, **kwargs)
        return dataclasses.replace(t, written_locs=t.written_locs + 4)

    monkeypatch.setattr(engine_mod, "expand", next_page)
    with pytest.raises(RuntimeError, match="wrote a page it does not own"):
        run(mixed_trace(4).batches, level=2)
    monkeypatch.setattr(DebugChecks, "check_writes_owned", lambda self, tensors: None)
    with pytest.raises(RuntimeError, match="stored token rows it does not own"):
        run(mixed_trace(4).batches, level=2)


@pytest.mark.parametrize(
    ("level", "words"),
    [(2, "shards do not cover the token rows in use"), (0, "replicated pools of ranks")],
)
def test_coverage_check_catches_one_missing_token_row(
    level: int, words: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the view and written checks off, coverage alone must see one token row missing
    from a page that other rows of the batch did write (a per-page record passes it)."""
    monkeypatch.setattr(DebugChecks, "check_view", lambda *args: None)
    monkeypatch.setattr(DebugChecks, "check_written", lambda *args: None)
    drop_last_planned_write(monkeypatch)
    with pytest.raises(RuntimeError, match=words):
        run(CURRENT_ONLY, level=level)


class Reached(Exception):
    """Raised by a spy once it has seen what a command handed down."""


def spy_engines(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    seen: list[bool] = []
    real_init = engine_mod.CPEngine.__init__

    def init(self: engine_mod.CPEngine, *args: Any, **kwargs: Any) -> None:
        seen.append(bool(kwargs.get("debug_checks")))
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(engine_mod.CPEngine, "__init__", init)
    return seen


def spy_pd_jobs(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    seen: list[bool] = []

    def gloo(jobs: Any, *args: Any, **kwargs: Any) -> Any:
        seen.extend(job.debug_checks for job in jobs)
        raise Reached

    monkeypatch.setattr(pd_mod, "run_jobs_on_gloo", gloo)
    return seen


@pytest.mark.parametrize("value", ["1", "0"])
def test_flag_reaches_verify(
    value: str, mixed_trace_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SGLANG_DEBUG_CP_SHARED_KV", value)
    seen = spy_engines(monkeypatch)
    args = ["verify", str(mixed_trace_path), "--phases", "2", "--cp-size", "2", "--page-size", "4"]
    result = runner.invoke(app, [*args, "--backend", "local", "--json"])
    assert result.exit_code == 0, result.output
    assert seen and set(seen) == {value == "1"}


def test_flag_reaches_verify_and_catches_a_dropped_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        '{"batch": 0, "requests": [{"rid": "a", "prefix_len": 0, "extend_len": 13}]}\n'
    )
    monkeypatch.setenv("SGLANG_DEBUG_CP_SHARED_KV", "1")
    drop_last_write(monkeypatch)
    args = ["verify", str(trace), "--phases", "2,3", "--cp-size", "2", "--page-size", "4"]
    result = runner.invoke(app, [*args, "--backend", "local", "--json"])
    assert result.exit_code != 0
    assert "differ from their owners' pools" in str(result.exception)


def test_flag_reaches_demo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGLANG_DEBUG_CP_SHARED_KV", "1")
    verified: list[bool] = []

    def verify_spy(job: RankJob, *args: Any, **kwargs: Any) -> list[LevelRun]:
        verified.append(job.debug_checks)  # NOTE: the job every rank runs
        return []

    monkeypatch.setattr(shared_mod, "run_levels", verify_spy)
    monkeypatch.setattr(shared_mod, "verify_runs", lambda job, runs: VerifyReport(()))
    jobs = spy_pd_jobs(monkeypatch)
    result = runner.invoke(app, ["demo", "--backend", "local", "--cp-size", "2", "--json"])
    assert isinstance(result.exception, Reached), result.output
    assert verified == [True] and jobs == [True]


@pytest.mark.parametrize("value", ["1", "0"])
def test_flag_reaches_pd(
    value: str, mixed_trace_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SGLANG_DEBUG_CP_SHARED_KV", value)
    jobs = spy_pd_jobs(monkeypatch)
    args = ["pd", str(mixed_trace_path), "--cp-size", "2", "--page-size", "4"]
    result = runner.invoke(app, args)
    assert isinstance(result.exception, Reached), result.output
    assert jobs == [value == "1"]


def test_debug_gathers_are_counted_apart() -> None:
    report = verify_levels(
        TINY, make_deploy(2, 4), CURRENT_ONLY, (3,), ALL, Backend.LOCAL, debug_checks=True
    )
    tags = report.levels[0].rows[0].gathered_bytes_by_tag
    assert tags["debug"] > 0 and tags.get("materialize", 0) == 0
