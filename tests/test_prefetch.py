"""Prefetched materialization: layer l+1's history view is fetched while layer l computes.

Outputs stay bitwise equal to the reference (gather and peer-read, local ranks and a gloo
group with ``async_op=True`` gathers); the fetch of the next layer starts before this layer
attends, into the other of two buffers; without prefetch one buffer serves every layer.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from cpkv.cli import app
from cpkv.run.jobs import Backend
from cpkv.run.verify import VerifyReport, verify_levels
from cpkv_core.config import CpMode, DeploymentConfig, MaterializeMode, model_preset
from cpkv_core.runtime import engine as engine_mod
from cpkv_core.runtime.history_views import HistoryViews
from cpkv_core.runtime.kv_pool import KVRows
from flags import FLAG_SPECS
from phases.registry import REGISTERED_PHASES
from tests.conftest import MIXED_TRACE, make_deploy, mixed_trace

TINY = model_preset("tiny")
ALL = frozenset(REGISTERED_PHASES)
runner = CliRunner()


def with_prefetch(
    deploy: DeploymentConfig, materialize: MaterializeMode, prefetch: bool = True
) -> DeploymentConfig:
    return deploy.model_copy(update={"materialize": materialize, "materialize_prefetch": prefetch})


def run(deploy: DeploymentConfig, levels: range = range(6)) -> VerifyReport:
    batches = mixed_trace(deploy.page_size).batches
    return verify_levels(TINY, deploy, batches, levels, ALL, Backend.LOCAL)


@pytest.mark.parametrize("materialize", list(MaterializeMode))
def test_every_level_equals_the_reference_bitwise_with_prefetch(
    materialize: MaterializeMode,
) -> None:
    report = run(with_prefetch(make_deploy(3, 4, CpMode.ROUND_ROBIN_SPLIT), materialize))
    assert report.ok
    for level in report.levels:
        for row in level.rows:
            assert row.comparison.max_abs_diff == 0.0 and row.comparison.topk_equal


class Spy:
    """Records every fetch start and key read, with the buffer each layer got."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.events: list[tuple[str, int]] = []
        self.buffers: dict[int, int] = {}
        start, keys = HistoryViews.start, HistoryViews.keys
        spy = self

        def recording_start(views: HistoryViews, layer: int) -> None:
            if layer < len(views.pool.layers) and layer not in views.pending:
                spy.events.append(("start", layer))
            start(views, layer)

        def recording_keys(views: HistoryViews, layer: int, current: KVRows) -> KVRows:
            spy.events.append(("keys", layer))
            buffer = keys(views, layer, current)
            spy.buffers[layer] = buffer.latent.data_ptr()
            return buffer

        monkeypatch.setattr(HistoryViews, "start", recording_start)
        monkeypatch.setattr(HistoryViews, "keys", recording_keys)


def one_rank_events(monkeypatch: pytest.MonkeyPatch, prefetch: bool) -> Spy:
    spy = Spy(monkeypatch)
    deploy = with_prefetch(make_deploy(1, 4), MaterializeMode.GATHER, prefetch)
    assert run(deploy, range(2, 3)).ok
    return spy


def test_prefetch_starts_the_next_layer_before_this_layer_attends_into_the_other_buffer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spy = one_rank_events(monkeypatch, prefetch=True)
    # NOTE: tiny has two layers; per batch: 0 fetched ahead of the loop, 1 as soon as 0 is in.
    assert spy.events[:4] == [("start", 0), ("keys", 0), ("start", 1), ("keys", 1)]
    assert spy.buffers[0] != spy.buffers[1]


def test_without_prefetch_each_layer_fetches_when_it_reads_into_one_buffer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spy = one_rank_events(monkeypatch, prefetch=False)
    assert not spy.events, "without prefetch the gather path keeps its full-view read"


def test_exposed_materialization_time_is_reported_for_view_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[float] = []
    real = engine_mod.CPEngine.run_batch

    def recording(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = real(self, *args, **kwargs)
        seen.append(out.exposed_materialize_seconds)
        return out

    monkeypatch.setattr(engine_mod.CPEngine, "run_batch", recording)
    deploy = with_prefetch(make_deploy(2, 4), MaterializeMode.GATHER)
    assert run(deploy, range(2, 3)).ok
    assert seen and all(s >= 0.0 for s in seen) and max(seen) > 0.0


@pytest.mark.gloo
def test_verify_with_prefetch_on_gloo_is_ok_at_every_level() -> None:
    """The async_op=True gathers of a real gloo group."""
    args = ["verify", str(MIXED_TRACE), "--phases", "2", "--cp-size", "2", "--page-size", "4"]
    result = runner.invoke(app, [*args, "--materialize-prefetch", "--backend", "gloo", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert [level["ok"] for level in document["levels"]] == [True] * 3
    level2 = [b for b in document["batches"] if b["level"] == 2]
    assert any(b["gathered_bytes_by_tag"].get("materialize", 0) > 0 for b in level2)
    assert all(b["max_abs_diff"] == 0.0 for b in document["batches"])


def _materialize_bytes(document: dict[str, Any]) -> list[int]:
    """Level 2's bytes gathered to materialize history, batch by batch (a ``--json`` doc)."""
    level2 = [b for b in document["batches"] if b["level"] == 2]
    return [b["gathered_bytes_by_tag"].get("materialize", 0) for b in level2]


@functools.cache
def _direct(prefetch: bool) -> list[int]:
    """The same at level 2 from a deployment built here, with or without prefetch."""
    deploy = with_prefetch(make_deploy(2, 4), MaterializeMode.GATHER, prefetch)
    return _materialize_bytes(run(deploy, range(2, 3)).to_json())


@pytest.mark.parametrize("source", ["none", "option", "environment", "config file"])
def test_each_flag_source_turns_prefetch_on_in_the_run(
    source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The option, the variable and the config key reach the engine: with prefetch the
    view reads only history pages, so a current-only batch gathers nothing to materialize
    and the others gather less; a run without prefetch gathers the full view."""
    monkeypatch.chdir(tmp_path)  # NOTE: no cpkv.toml of the caller's
    for name in ("CPKV_CONFIG", FLAG_SPECS["materialize_prefetch"].env):
        monkeypatch.delenv(name, raising=False)
    args = ["verify", str(MIXED_TRACE), "--phases", "2", "--cp-size", "2", "--page-size", "4"]
    env: dict[str, str] = {}
    if source == "option":
        args.append("--materialize-prefetch")
    elif source == "environment":
        env[FLAG_SPECS["materialize_prefetch"].env] = "1"
    elif source == "config file":
        config = tmp_path / "flags.toml"
        config.write_text("materialize-prefetch = true\n")
        args += ["--config", str(config)]
    result = runner.invoke(app, [*args, "--backend", "local", "--json"], env=env)
    assert result.exit_code == 0, result.output
    got = _materialize_bytes(json.loads(result.stdout))
    with_it, without = _direct(True), _direct(False)
    assert with_it[0] == 0 < without[0] and with_it != without
    assert got == (without if source == "none" else with_it)


def test_local_async_gather_completes_into_the_given_buffer() -> None:
    from cpkv_core.dist import run_local

    def fn(comm: Any) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.full((3,), float(comm.rank)).to(torch.float8_e4m3fn)
        out = torch.empty((2, 3), dtype=torch.float8_e4m3fn)
        got = comm.all_gather_async(x, "t", out).wait()
        return got.view(torch.uint8), out.view(torch.uint8)

    for got, out in run_local(2, fn):
        assert torch.equal(got, out)
        expected = torch.stack([torch.full((3,), float(r)) for r in range(2)])
        assert torch.equal(got, expected.to(torch.float8_e4m3fn).view(torch.uint8))
