"""The CLI through typer's runner: exit codes, messages, and --json round trips."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from cpkv.cli import app
from cpkv.render.reports import render_dry_run
from cpkv.run.dry_run import DryRunReport, LevelDryRun
from cpkv.run.jobs import final_seq_lens
from cpkv_core.config import IndexKDtype
from cpkv_core.planning.pd_reshard import decode_tokens
from cpkv_core.traces.trace import load_trace
from tests.conftest import DATA, tiny_row_bytes

FP8 = IndexKDtype.FP8_E4M3

runner = CliRunner()


def test_verify_json_round_trips(mixed_trace_path: Path) -> None:
    result = runner.invoke(
        app,
        [
            "verify",
            str(mixed_trace_path),
            "--cp-size",
            "3",
            "--page-size",
            "4",
            "--cp-mode",
            "round-robin-split",
            "--backend",
            "local",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["ok"] is True
    assert doc["levels"] == [{"level": 0, "ok": True, "max_abs_diff": 0.0}]
    assert [b["batch"] for b in doc["batches"]] == [0, 1, 2, 3]
    assert all(b["topk_equal"] and len(b["kv_bytes_by_rank"]) == 3 for b in doc["batches"])


@pytest.mark.gloo
def test_verify_on_real_gloo_ranks(mixed_trace_path: Path) -> None:
    result = runner.invoke(
        app,
        [
            "verify",
            str(mixed_trace_path),
            "--phases",
            "all",
            "--cp-size",
            "2",
            "--page-size",
            "16",
            "--backend",
            "gloo",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["ok"] is True and doc["levels"][0]["max_abs_diff"] == 0.0
    assert all(len(b["gathered_bytes_by_rank"]) == 2 for b in doc["batches"])


def test_verify_on_meta_runs_every_level_on_shapes_alone(mixed_trace_path: Path) -> None:
    # NOTE: meta ops run through Python reference kernels (~0.2 ms each): cp 2 keeps it short;
    # the docs' cp 4 line is the same code path.
    args = ["verify", str(mixed_trace_path), "--phases", "all", "--cp-size", "2"]
    result = runner.invoke(app, [*args, "--page-size", "4", "--device", "meta", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["ok"] is True and doc["device"] == "meta"
    assert [(lv["level"], lv["ok"], lv["batches"]) for lv in doc["levels"]] == [
        (level, True, 4) for level in range(6)
    ]
    fields = ("level", "batches", "error", "where")
    levels = tuple(LevelDryRun(**{k: lv[k] for k in fields}) for lv in doc["levels"])
    report = DryRunReport(2, levels)
    buffer = io.StringIO()
    render_dry_run(Console(file=buffer, width=120), report)
    assert "level 5: ok (4 batches on meta, cp_size=2)" in buffer.getvalue()


def test_verify_on_meta_names_the_op_that_read_a_value(
    mixed_trace_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cpkv_core.runtime import model as model_mod

    original = model_mod.select_topk

    def reads_a_value(scores, query_positions, topk):  # type: ignore[no-untyped-def]
        int(query_positions.max())  # a host read: fails on meta, syncs on CUDA
        return original(scores, query_positions, topk)

    monkeypatch.setattr(model_mod, "select_topk", reads_a_value)
    args = ["verify", str(mixed_trace_path), "--phases", "1", "--cp-size", "2"]
    result = runner.invoke(app, [*args, "--page-size", "4", "--device", "meta", "--json"])
    assert result.exit_code == 1, result.output
    levels = json.loads(result.stdout)["levels"]
    assert [lv["ok"] for lv in levels] == [False, False]
    where = levels[0]["where"]
    assert where.startswith("model.py:") and where.endswith("in indexer_topk"), where
    assert "meta" in levels[0]["error"]


def test_cuda_device_is_refused_without_one(mixed_trace_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    args = ["verify", str(mixed_trace_path), "--page-size", "4", "--device", "cuda"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert "--device cuda needs a CUDA device" in result.stderr


@pytest.mark.gloo
def test_demo_runs_every_level_and_pd_and_reports_a_verdict() -> None:
    """Every level and PD, with phase 1 failing in batch 4 on one rank: it is killed and the
    batch rerun at every level that has it, and in the PD prefill."""
    args = ["demo", "--backend", "local", "--cp-size", "2", "--inject-fault", "1:raise@4"]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["ok"] is True and [lv["level"] for lv in doc["levels"]] == [0, 1, 2, 3, 4, 5]
    assert 5 in {b["phase"] for b in doc["batches"] if b["level"] == 5}
    assert doc["pd"]["ok"] is True and len(doc["pd"]["requests"]) == 8
    for failures, levels in ((doc["failures"], [1, 2, 3, 4, 5]), (doc["pd"]["failures"], [5])):
        assert [(k["level"], k["phase"], k["batch"]) for k in failures["kills"]] == [
            (level, 1, 4) for level in levels
        ]
        assert failures["rerun_count"] == len(levels) and failures["batches_lost"] == 0


@pytest.mark.parametrize(
    ("line", "words"),
    [
        (
            '{"batch": 0, "requests": [{"rid": "a", "prefix_len": -1, "extend_len": 4}]}',
            "prefix_len",
        ),
        ('{"batch": 0, "requests": [{"rid": "a", "extend_len": 4}]}', "prefix_len"),
        (
            '{"batch": 0, "requests": [{"rid": "a", "prefix_len": 4, "extend_len": 4, '
            '"prefix_from": "z"}]}',
            "prefix_from",
        ),
    ],
)
def test_bad_trace_exits_2_naming_line_and_field(tmp_path: Path, line: str, words: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(line + "\n")
    result = runner.invoke(app, ["verify", str(path), "--backend", "local"])
    assert result.exit_code == 2
    assert "bad.jsonl:1" in result.stderr and words in result.stderr


def test_bad_cp_size_exits_2(mixed_trace_path: Path) -> None:
    result = runner.invoke(
        app, ["verify", str(mixed_trace_path), "--cp-size", "0", "--backend", "local"]
    )
    assert result.exit_code == 2
    assert "cp_size" in result.stderr


def test_published_presets_are_for_planning_only(mixed_trace_path: Path) -> None:
    result = runner.invoke(
        app, ["verify", str(mixed_trace_path), "--model", "deepseek-v3.2", "--backend", "local"]
    )
    assert result.exit_code == 2
    assert "planning only" in result.stderr


@pytest.mark.gloo
def test_pd_json_round_trips() -> None:
    """docs/pd.md's re-shard, on page 16: cp 4 to two decode ranks, every level on."""
    args = ["pd", str(DATA / "long.jsonl"), "--phases", "all", "--cp-size", "4"]
    result = runner.invoke(app, [*args, "--page-size", "16", "--decode-cp-size", "2", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["ok"] is True and doc["cp_size"] == 4 and doc["decode_cp_size"] == 2
    lens = final_seq_lens(load_trace(DATA / "long.jsonl", 16).batches)
    assert [r["rid"] for r in doc["requests"]] == list(lens)
    for request in doc["requests"]:
        assert request["ok"] and request["kv_equal"] and request["decode_topk_equal"]
        assert request["level"] == 5 and 0.0 <= request["decode_max_abs_diff"] <= 1e-5
        pairs = request["bytes_by_pair"]
        assert [sum(row) for row in pairs] == request["bytes_by_rank"] and len(pairs) == 4
        # each decode rank received exactly the tokens of its positions, from their owners
        received = [sum(row[b] for row in pairs) for b in range(2)]
        n = lens[request["rid"]]
        assert received == [decode_tokens(n, 16, b, 2) * tiny_row_bytes(FP8) for b in range(2)]
