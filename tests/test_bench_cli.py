"""``cpkv bench`` through typer's runner, a few sections a test (``--only``), on the long trace at
page 16 with one timed round: every figure's JSON, the PNGs ``--out`` draws from it, the
progress lines on stderr. No timing is asserted beyond being positive."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from cpkv.bench.cp_off import CP_OFF_SIZES
from cpkv.bench.sections import section_names
from cpkv.cli import app
from cpkv.run.jobs import final_seq_lens
from cpkv_core.config import IndexKDtype
from cpkv_core.traces import load_trace
from tests.conftest import DATA, tiny_row_bytes

runner = CliRunner()
TRACE = DATA / "long.jsonl"
ARGS = ["bench", "--trace", str(TRACE), "--page-size", "16", "--repeats", "1", "--json"]
FIGURE_KEYS = {
    "sglang_plugin": {"sglang_plugin"},
    "gate": {"gate"},
    "host_plan": {"host_plan"},
    "remaps": {"remaps"},
    "rollback": {"rollback"},
    "pd": {"pd"},
    "tail_bytes": {"tail_bytes"},
    "kv_share": {"kv_share"},
    "balance": {"balance", "write_path_round_robin"},
    "step_time": {"step_time", "materialized", "write_path", "bytes_by_batch", "page_balance"},
    "cp_off": {"cp_off"},
    "peer_read": {"peer_read", "overlap"},
}
"""The document keys each section writes."""


@pytest.fixture(autouse=True)
def isolated_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No stray ./cpkv.toml or environment decides these runs."""
    monkeypatch.chdir(tmp_path)
    for name in ("CPKV_CONFIG", "CPKV_MAX_PHASE", "SGLANG_DEBUG_CP_SHARED_KV"):
        monkeypatch.delenv(name, raising=False)


def run_sections(
    sections: list[str], out: Path, extra: tuple[str, ...] = ()
) -> tuple[dict[str, Any], Result]:
    """``cpkv bench --only SECTIONS --out OUT --json EXTRA``: the document (checked against
    the ``bench.json`` it wrote, and to hold those sections' figures alone) and the result."""
    only = ["--only", ",".join(sections), "--out", str(out)]
    result = runner.invoke(app, [*ARGS, *only, *extra])
    assert result.exit_code == 0, result.output
    doc: dict[str, Any] = json.loads(result.stdout)
    assert json.loads((out / "bench.json").read_text()) == doc
    figures = set().union(*(FIGURE_KEYS[name] for name in sections))
    assert set(doc) == {"warnings", "section_seconds", *figures}
    assert list(doc["section_seconds"]) == sections
    for name in sections:  # NOTE: one progress line a section, with its wall seconds
        assert f"bench: {name} {doc['section_seconds'][name]:.1f} s" in result.stderr
    return doc, result


def pngs(out: Path) -> set[str]:
    return {p.stem for p in out.glob("*.png")}


def test_sections_table_names_every_figure_once() -> None:
    assert section_names() == list(FIGURE_KEYS)


def test_only_refuses_a_section_that_is_none_naming_the_sections() -> None:
    result = runner.invoke(app, ["bench", "--only", "gate,nope"])
    assert result.exit_code == 2, result.output
    assert "nope is not a bench section" in result.stderr
    assert all(name in result.stderr for name in section_names())
    rows = runner.invoke(app, ["bench", "--rows", "glm-5", "--only", "gate"])
    assert rows.exit_code == 2 and "--rows has none" in rows.stderr


def test_text_output_prints_the_tables_of_the_sections_run() -> None:
    result = runner.invoke(app, ["bench", "--only", "host_plan,gate"])
    assert result.exit_code == 0, result.output
    assert "gate decision time per batch" in result.stdout
    assert "host plan of one rank per batch" in result.stdout
    assert "phase 2: persistent KV per rank" not in result.stdout
    # NOTE: the table's order, whatever the order named
    assert result.stderr.index("bench: gate") < result.stderr.index("bench: host_plan")


def test_host_and_byte_sections_report_their_figures(tmp_path: Path) -> None:
    names = ["gate", "host_plan", "remaps", "rollback", "tail_bytes", "kv_share", "balance"]
    doc, _ = run_sections(names, tmp_path)
    assert {"gate-time", "remap-view-bytes"} <= pngs(tmp_path)
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
    remaps = {(r["batch"], r["remap"]): r["view_bytes"] for r in doc["remaps"]}
    shared = remaps["shared prefix", "materialized-unique"]
    assert shared < remaps["shared prefix", "materialized-slot"]
    assert_rollback(doc["rollback"])
    assert_balance_and_round_robin_write_path(doc)


def assert_rollback(rollback: dict[str, Any]) -> None:
    """Each rank saves the rows it will write: every row at level 0, its own at 2 and 5."""
    batches = load_trace(TRACE, 16).batches
    assert rollback["row_bytes"] == tiny_row_bytes(IndexKDtype.FP8_E4M3)
    assert [lv["level"] for lv in rollback["levels"]] == [0, 2, 5]
    for level in rollback["levels"]:
        assert [row["tokens"] for row in level["batches"]] == [b.num_tokens for b in batches]
        for row in level["batches"]:
            copies = rollback["cp_size"] if level["level"] == 0 else 1
            assert sum(row["saved_bytes_by_rank"]) == copies * row["tokens"] * rollback["row_bytes"]
            assert 0 < row["save_over_step"] < 1
    assert isinstance(rollback["save_over_step"], float) and rollback["save_over_step"] > 0
    assert rollback["saved_bytes_per_batch"] > 0


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


def test_gloo_sections_report_their_figures(tmp_path: Path) -> None:
    doc, _ = run_sections(["step_time", "peer_read"], tmp_path)
    assert "bytes-by-batch" in pngs(tmp_path)
    for row in doc["bytes_by_batch"]:
        parts = ("write", "current_gather", "materialize", "tail")
        assert row["total"] == sum(row[part] for part in parts)
        # NOTE: batch 2 runs unsplit (SGLang's gate): below level 2 it gathers nothing.
        assert (row["total"] == 0) == (row["batch"] == 2 and row["level"] < 2), row
        assert row["write"] == 0 or row["phase"] != 5
    for row in doc["materialized"]:
        assert row["level2_bytes"] > 0
        assert (row["level3_bytes"] == 0) == (not row["has_history"])
    assert [t["level"] for t in doc["step_time"]["levels"]] == [0, 1, 2, 3, 4, 5]
    assert doc["step_time"]["levels"][0]["ratio_to_level0"] == 1.0
    level5 = [row for row in doc["write_path"] if row["level"] == 5 and row["phase"] == 5]
    assert level5 and all(row["write_path_bytes"] == 0 for row in level5)
    assert_views(doc)


def test_cp_off_section_reports_bytes_and_times_by_batch_size(tmp_path: Path) -> None:
    doc, _ = run_sections(["cp_off"], tmp_path)
    assert "cp-off-step-time" in pngs(tmp_path)
    cp_off = doc["cp_off"]
    batches = load_trace(TRACE, 16).batches
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


def assert_views(doc: dict[str, Any]) -> None:
    """Peer-read moves no materialize bytes and copies less; prefetch hides some of it."""
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


def test_pd_section_reports_every_level_and_decode_group(tmp_path: Path) -> None:
    doc, _ = run_sections(["pd"], tmp_path)
    assert "pd-bytes-by-rank" in pngs(tmp_path)
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
    tokens = sum(final_seq_lens(load_trace(TRACE, 16).batches).values())
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


def test_sglang_plugin_section_measures_sglang_s_own_tail_gather(tmp_path: Path) -> None:
    """SGLang's own tail gather at 7,168 x bf16: cp x bs rows with the plugin, every token's
    row without; skipped only where SGLang's CP path is not installed (never under CI). On 2
    ranks, the bench's --cp-size: half the processes of the default 4 to start and patch."""
    doc, _ = run_sections(["sglang_plugin"], tmp_path, ("--cp-size", "2"))
    figure = doc["sglang_plugin"]
    if importlib.util.find_spec("sglang") is None and os.environ.get("CI") != "true":
        assert figure["skipped"].endswith("section skipped") and figure["rows"] == []
        return
    assert figure["skipped"] == "" and figure["logits_bitwise_equal"] is True
    assert figure["cp_size"] == 2
    assert [row["bs"] for row in figure["rows"]] == [1, 2, 4, 8, 16, 32, 64]
    row_bytes = figure["hidden"] * 2
    for row in figure["rows"]:
        assert row["plugin_rows"] == figure["cp_size"] * row["bs"] < row["stock_rows"]
        assert row["stock_rows"] >= row["tokens"] == row["bs"] * figure["tokens_per_request"]
        assert row["plugin_bytes"] == row["plugin_rows"] * row_bytes
        assert row["stock_bytes"] == row["stock_rows"] * row_bytes
