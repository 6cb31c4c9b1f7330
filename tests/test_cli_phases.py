"""`cpkv explain`, `cpkv phases`, `cpkv verify --phases` and `cpkv bench` through typer's runner."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cpkv.bench.cp_off import CP_OFF_SIZES
from cpkv.cli import app
from cpkv.run.jobs import final_seq_lens
from cpkv_core.config import IndexKDtype
from cpkv_core.traces import load_trace
from tests.conftest import DATA, tiny_row_bytes

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


def test_bad_phase_list_exits_2() -> None:
    result = runner.invoke(app, ["explain", NARROW_TRACE, "--phases", "1,7"])
    assert result.exit_code == 2
    assert "'7'" in result.stderr


def test_bench_json_reports_every_figure(tmp_path: Path) -> None:
    trace = str(DATA / "long.jsonl")
    args = ["bench", "--trace", trace, "--page-size", "16", "--repeats", "1", "--json"]
    result = runner.invoke(app, [*args, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert json.loads((tmp_path / "bench.json").read_text()) == doc
    pngs = {"bytes-by-batch", "gate-time", "remap-view-bytes", "pd-bytes-by-rank"}
    assert pngs <= {p.stem for p in tmp_path.glob("*.png")}
    for row in doc["bytes_by_batch"]:
        parts = ("write", "current_gather", "materialize", "tail")
        assert row["total"] == sum(row[part] for part in parts)
        # NOTE: batch 2 runs unsplit (SGLang's gate): below level 2 it gathers nothing.
        assert (row["total"] == 0) == (row["batch"] == 2 and row["level"] < 2), row
        assert row["write"] == 0 or row["phase"] != 5
    assert [g["bs"] for g in doc["gate"]] == [1, 32, 256]
    plans = doc["host_plan"]
    assert [row["history_tokens"] for row in plans] == [4096, 32768, 131072]
    # 8 requests, page 64 whatever --page-size says, 2 * cp_size pages each computed now.
    assert [row["pages"] for row in plans] == [8 * (h // 64 + 8) for h in (4096, 32768, 131072)]
    assert all(row["microseconds"] > 0 and row["phase"] == 5 for row in plans)
    for row in doc["tail_bytes"]:
        assert row["narrow_bytes"] == row["cp_size"] * row["bs"] * 64 * 4
        assert row["narrow_bytes"] < row["full_gather_bytes"]
    assert [row["cp_size"] for row in doc["kv_share"]] == [2, 4, 8]
    assert all(row["within_target"] for row in doc["kv_share"])
    for row in doc["materialized"]:
        assert row["level2_bytes"] > 0
        assert (row["level3_bytes"] == 0) == (not row["has_history"])
    remaps = {(r["batch"], r["remap"]): r["view_bytes"] for r in doc["remaps"]}
    shared = remaps["shared prefix", "materialized-unique"]
    assert shared < remaps["shared prefix", "materialized-slot"]
    assert [t["level"] for t in doc["step_time"]["levels"]] == [0, 1, 2, 3, 4, 5]
    pd = doc["pd"]
    assert [row["level"] for row in pd["levels"]] == [0, 2, 5]
    assert all(row["max_share"] < 0.3 and row["mib_per_second"] > 0 for row in pd["levels"])
    for row in pd["levels"]:  # the baseline writes the level's KV bytes, all ranks' together
        assert row["large_write_bytes"] == sum(row["bytes_by_rank"])
        assert row["large_write_mib_per_second"] > 0 and all(row["write_calls_by_rank"])
    assert isinstance(pd["throughput_ratio"], float) and pd["throughput_ratio"] > 0
    assert pd["group_throughput_ratio"] > 0 and pd["median_flush_ratio"] > 0
    # DeepSeek-V3.2's rows on the tiny model's 2 layers: fp32 latent 512 + rope 64, fp8
    # index K 128 and its fp32 scale.
    assert pd["row_bytes_per_token"] == 2 * ((512 + 64) * 4 + 128 + 4)
    tokens = sum(final_seq_lens(load_trace(DATA / "long.jsonl", 16).batches).values())
    for row in pd["levels"]:  # the ceiling: every rank writes its share at once
        assert sum(row["bytes_by_rank"]) == tokens * pd["row_bytes_per_token"]
        assert 0 <= row["concurrent_write_bytes"] - row["large_write_bytes"] < 4
        assert row["concurrent_mib_per_second"] > 0 and row["concurrent_group_mib_per_second"] > 0
    assert pd["ceiling_ratio"] > 0 and pd["group_ceiling_ratio"] > 0 and pd["of_ceiling"] > 0
    assert pd["exposed_fraction"] > 0
    assert all(row["exposed_seconds_by_rank"] for row in pd["levels"])
    # the top level re-sharded: M = 1 (the level-5 row), M = N = 4 and M = 2 != N
    reshard = pd["by_decode_cp_size"]
    assert [row["decode_cp_size"] for row in reshard] == [1, 4, 2]
    assert reshard[0] == {**pd["levels"][-1], "throughput_ratio": reshard[0]["throughput_ratio"]}
    for row in reshard:
        pairs = row["bytes_by_pair"]
        assert len(pairs) == 4 and all(len(dests) == row["decode_cp_size"] for dests in pairs)
        assert [sum(dests) for dests in pairs] == row["bytes_by_rank"]
        assert sum(row["bytes_by_rank"]) == tokens * pd["row_bytes_per_token"]
        calls, descriptors = row["write_calls_by_rank"], row["descriptors_by_rank"]
        assert all(0 < c <= d for c, d in zip(calls, descriptors, strict=True))
        assert row["throughput_ratio"] > 0
    level5 = [row for row in doc["write_path"] if row["level"] == 5 and row["phase"] == 5]
    assert level5 and all(row["write_path_bytes"] == 0 for row in level5)
    assert doc["step_time"]["levels"][0]["ratio_to_level0"] == 1.0
    cp_off = doc["cp_off"]
    batches = load_trace(DATA / "long.jsonl", 16).batches
    below = {b.batch for b in batches if b.num_tokens < cp_off["min_tokens"]}
    assert below and {row["batch"] for row in cp_off["bytes"]} == below
    for row in cp_off["bytes"]:
        if row["cp"] == "off":  # the none split gathers no current chunk and no tail
            assert (row["split"], row["current_gather"], row["tail"]) == ("none", 0, 0)
        else:
            assert row["split"] != "none" and row["tail"] > 0
    sizes = cp_off["step_time"]["sizes"]
    assert [row["tokens"] for row in sizes] == list(CP_OFF_SIZES)
    assert all(row["cp_on_seconds"] > 0 and row["cp_off_seconds"] > 0 for row in sizes)
    assert "cp-off-step-time" in {p.stem for p in tmp_path.glob("*.png")}
    peer = doc["peer_read"]
    assert peer["level"] == 2 and len(peer["batches"]) == 4
    for row in peer["batches"]:
        assert row["peer_read"]["materialize_bytes"] == 0 < row["gather"]["materialize_bytes"]
        gather_bytes = row["gather"]["collective_bytes"]
        others = {tag: b for tag, b in gather_bytes.items() if tag != "materialize"}
        assert others == {t: b for t, b in row["peer_read"]["collective_bytes"].items() if b}
        assert 0 < row["peer_read"]["copied_bytes"] < row["gather"]["copied_bytes"]
        assert row["time_ratio"] > 0
    assert [row["history_tokens"] > 0 for row in peer["batches"]] == [False, True, True, True]
    overlap = doc["overlap"]
    assert (overlap["level"], overlap["materialize"], overlap["batches"]) == (2, "gather", 4)
    for mode in ("without_prefetch", "with_prefetch"):
        assert overlap[mode]["step_seconds"] > overlap[mode]["exposed_seconds"] > 0
    assert overlap["exposed_ratio"] > 0
    rollback = doc["rollback"]
    assert rollback["row_bytes"] == tiny_row_bytes(IndexKDtype.FP8_E4M3)
    assert [lv["level"] for lv in rollback["levels"]] == [0, 2, 5]
    for level in rollback["levels"]:
        assert [row["tokens"] for row in level["batches"]] == [b.num_tokens for b in batches]
        for row in level["batches"]:  # replicated: each rank saves every row; else its own
            copies = rollback["cp_size"] if level["level"] == 0 else 1
            assert sum(row["saved_bytes_by_rank"]) == copies * row["tokens"] * rollback["row_bytes"]
            assert 0 < row["save_over_step"] < 1
    assert isinstance(rollback["save_over_step"], float) and rollback["save_over_step"] > 0
    assert rollback["saved_bytes_per_batch"] > 0
    assert_balance_and_round_robin_write_path(doc)
    assert_sglang_plugin_section(doc["sglang_plugin"])


def assert_sglang_plugin_section(figure: dict[str, Any]) -> None:
    """SGLang's own tail gather at 7,168 x bf16: cp x bs rows with the plugin, every token's
    row without; skipped only where SGLang's CP path is not installed (never under CI)."""
    if importlib.util.find_spec("sglang") is None and os.environ.get("CI") != "true":
        assert figure["skipped"].endswith("section skipped") and figure["rows"] == []
        return
    assert figure["skipped"] == "" and figure["logits_bitwise_equal"] is True
    assert [row["bs"] for row in figure["rows"]] == [1, 2, 4, 8, 16, 32, 64]
    row_bytes = figure["hidden"] * 2
    for row in figure["rows"]:
        assert row["plugin_rows"] == figure["cp_size"] * row["bs"] < row["stock_rows"]
        assert row["stock_rows"] >= row["tokens"] == row["bs"] * figure["tokens_per_request"]
        assert row["plugin_bytes"] == row["plugin_rows"] * row_bytes
        assert row["stock_bytes"] == row["stock_rows"] * row_bytes


def assert_balance_and_round_robin_write_path(doc: dict[str, Any]) -> None:
    """Every preset, size and CP size has every split, each dealing the same tokens; token
    interleave is balanced; round-robin's phase-5 batches gather nothing for the write."""
    splits = doc["balance"]["splits"]
    keys = {(r["size"], r["preset"], r["cp_size"]) for r in splits}
    assert keys == {
        (size, preset, cp)
        for size in ("small", "full")
        for preset in ("chat", "long-doc", "agent")
        for cp in (2, 4, 8)
    }
    names = {"round-robin", "page-interleaved", "page-interleaved+rule", "zigzag"}
    assert {r["split"] for r in splits} == names | {"page-aligned-zigzag+rule"}
    for key in keys:
        rows = {r["split"]: r for r in splits if (r["size"], r["preset"], r["cp_size"]) == key}
        assert len({sum(r["tokens_by_rank"]) for r in rows.values()}) == 1
        assert len({sum(r["work_by_rank"]) for r in rows.values()}) == 1
        assert rows["round-robin"]["work_max_over_mean"] < 1.05
        rule = rows["page-interleaved+rule"]
        assert 0 <= rule["applied"] <= rule["batches"] == rows["round-robin"]["batches"]
    rr = doc["write_path_round_robin"]["rows"]
    direct = [r for r in rr if r["level"] == 5 and r["phase"] == 5]
    assert direct and all(r["write_path_bytes"] == 0 for r in direct)
    assert any(r["write_path_bytes"] > 0 for r in rr if r["level"] == 4)


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
