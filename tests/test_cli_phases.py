"""`cpkv explain`, `cpkv phases` and `cpkv verify --phases` through typer's runner (`cpkv bench`'s
figures: ``test_bench_cli.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cpkv.cli import app
from cpkv.common.settings import RunSettings
from cpkv_core.config import DeploymentConfig
from phases import PhaseId
from tests.conftest import DATA

runner = CliRunner()
NARROW_TRACE = str(DATA / "narrow.jsonl")


@pytest.fixture(autouse=True)
def isolated_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No stray ./cpkv.toml or environment decides these runs."""
    monkeypatch.chdir(tmp_path)
    for name in ("CPKV_CONFIG", "CPKV_MAX_PHASE", "SGLANG_DEBUG_CP_SHARED_KV"):
        monkeypatch.delenv(name, raising=False)


def test_explain_json_lists_every_batch_with_reasons() -> None:
    args = ["explain", NARROW_TRACE, "--phases", "1", "--cp-size", "2", "--page-size", "4"]
    # NOTE: split anyway, so that batches 0 and 3 (requests of 1-3 tokens) narrow
    result = runner.invoke(app, [*args, "--cp-split-gate", "split-anyway", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [b["phase"] for b in doc["batches"]] == [1, 0, 0, 1]
    phase1 = [b["phases"][0] for b in doc["batches"]]
    assert phase1[1] == {
        "phase": 1,
        "active": False,
        "reasons": ["SPEC_DECODE spec=EAGLE"],
        "codes": ["SPEC_DECODE"],
    }
    assert phase1[2]["reasons"] == ["RETURN_LOGPROB rid=d", "CAPTURE_HIDDEN rid=e"]
    assert doc["summary"]["batches_by_phase"] == {"0": 2, "1": 2}
    assert doc["summary"]["tokens_by_phase"] == {"0": 52, "1": 56}
    assert doc["summary"]["reasons_by_phase"]["1"] == {
        "CAPTURE_HIDDEN": 1,
        "RETURN_LOGPROB": 1,
        "SPEC_DECODE": 1,
    }


def test_explain_honours_the_kill_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CPKV_MAX_PHASE", "0")
    result = runner.invoke(
        app,
        [
            "explain",
            NARROW_TRACE,
            "--phases",
            "all",
            "--cp-size",
            "2",
            "--page-size",
            "4",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert {b["phase"] for b in doc["batches"]} == {0}
    assert "CEILING max_phase=0" in doc["batches"][0]["phases"][0]["reasons"]


def test_explain_reads_enabled_phases_from_the_config_file(tmp_path: Path) -> None:
    (tmp_path / "cpkv.toml").write_text(
        "enable-nsa-prefill-context-parallel = true\nattn-cp-size = 2\npage-size = 4\n"
        "enable-nsa-prefill-cp-narrow-output = true\n"
    )
    result = runner.invoke(app, ["explain", NARROW_TRACE, "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["enabled"] == [1] and doc["deployment"]["cp_size"] == 2


def test_phases_table_json() -> None:
    result = runner.invoke(app, ["phases", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["phases"]
    assert [r["phase"] for r in rows] == [1, 2, 3, 4, 5]
    assert rows[0]["flag"] == "--enable-nsa-prefill-cp-narrow-output"
    assert rows[0]["available"] is True and rows[0]["startup_ok"] is True
    assert rows[2]["needs"] == [2] and rows[4]["needs"] == [4]


def test_verify_runs_every_level_up_to_the_highest_enabled_phase() -> None:
    result = runner.invoke(
        app,
        [
            "verify",
            NARROW_TRACE,
            "--phases",
            "all",
            "--cp-size",
            "3",
            "--page-size",
            "4",
            "--backend",
            "local",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [lv["level"] for lv in doc["levels"]] == list(range(len(doc["levels"])))
    assert all(lv["ok"] and lv["max_abs_diff"] == 0.0 for lv in doc["levels"])


def test_verify_runs_no_level_above_the_kill_switch_ceiling(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``CPKV_MAX_PHASE=2`` with every phase enabled: levels 0, 1 and 2 run, the ceiling
    itself included, and none above it."""
    monkeypatch.setenv("CPKV_MAX_PHASE", "2")
    args = ["verify", NARROW_TRACE, "--phases", "all", "--cp-size", "2", "--page-size", "4"]
    result = runner.invoke(app, [*args, "--backend", "local", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [lv["level"] for lv in doc["levels"]] == [0, 1, 2]
    assert {b["level"] for b in doc["batches"]} == {0, 1, 2}


@pytest.mark.parametrize(
    ("ceiling", "levels", "top"),
    [(None, (0, 1, 2, 3, 4, 5), 5), (3, (0, 1, 2, 3), 3), (0, (0,), 0)],
)
def test_the_ceiling_caps_the_levels_verify_runs_and_the_level_pd_prefills_at(
    ceiling: int | None, levels: tuple[int, ...], top: int
) -> None:
    deploy = DeploymentConfig(cp_size=2, page_size=4)
    settings = RunSettings(deploy, frozenset(PhaseId), ceiling, debug_checks=False)
    assert (settings.levels(), settings.top_level()) == (levels, top)


def test_bad_phase_list_exits_2() -> None:
    result = runner.invoke(app, ["explain", NARROW_TRACE, "--phases", "1,7"])
    assert result.exit_code == 2
    assert "'7'" in result.stderr


def test_explain_chooses_phase_5_for_long_requests_and_explains_the_rest() -> None:
    result = runner.invoke(
        app,
        [
            "explain",
            str(DATA / "long.jsonl"),
            "--phases",
            "all",
            "--cp-size",
            "4",
            "--page-size",
            "16",
            "--cp-split-gate",
            "split-anyway",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    batches = json.loads(result.stdout)["batches"]
    assert [b["phase"] for b in batches] == [5, 5, 2, 5]
    assert batches[0]["plan"]["kv_write"] == "compute-owner-direct"
    short = {p["phase"]: p["reasons"] for p in batches[2]["phases"]}
    assert short[4] == ["SHORT_REQUEST rid=b pages=1 need=8", "SHORT_REQUEST rid=e pages=1 need=8"]
    assert short[5][0] == "NEEDS_INACTIVE phase=4"
    assert "NOT_PAGE_ALIGNED rid=b pages=1 need=8" in short[5]


def test_explain_reports_owner_mismatch_on_a_foreign_partial_page() -> None:
    result = runner.invoke(
        app,
        [
            "explain",
            str(DATA / "mixed.jsonl"),
            "--phases",
            "all",
            "--cp-size",
            "2",
            "--page-size",
            "4",
            "--cp-split-gate",
            "split-anyway",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    batch1 = json.loads(result.stdout)["batches"][1]["phases"][4]["reasons"]
    assert "OWNER_MISMATCH rid=a page=9 owner=1 compute_owner=0" in batch1


def test_phases_checks_the_start_up_contract_against_the_config_deployment(
    tmp_path: Path,
) -> None:
    """A PD prefill server on NIXL: phase 2's contract fails there (and only there), in the
    JSON and in the table, whose columns say phase 1 is enabled and every phase available."""
    config = tmp_path / "pd.toml"
    config.write_text(
        "enable-nsa-prefill-context-parallel = true\nattn-cp-size = 2\n"
        "enable-nsa-prefill-cp-narrow-output = true\n"
        'disaggregation-mode = "prefill"\ndisaggregation-transfer-backend = "nixl"\n'
    )
    result = runner.invoke(app, ["phases", "--config", str(config), "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["phases"]
    assert [r["startup_ok"] for r in rows] == [True, False, True, True, True]
    assert "pd_backend=nixl" in rows[1]["startup_reasons"][0]
    assert [r["enabled"] for r in rows] == [True, False, False, False, False]
    text = runner.invoke(app, ["phases", "--config", str(config)], env={"COLUMNS": "250"})
    assert text.exit_code == 0, text.output
    table = {}
    for line in text.stdout.splitlines():
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        if cells and cells[0].isdigit():
            table[int(cells[0])] = (cells[4], cells[5], cells[6].split()[0])
    assert table == {
        1: ("yes", "yes", "holds"),
        2: ("no", "yes", "STARTUP_CONTRACT"),
        3: ("no", "yes", "holds"),
        4: ("no", "yes", "holds"),
        5: ("no", "yes", "holds"),
    }
