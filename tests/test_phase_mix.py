"""The phase mix (``cpkv explain --summary``): shares of batches and tokens per phase, and
fallback reasons counted by code."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from cpkv.cli import app
from cpkv.run.explain import explain_trace
from cpkv_core.config import SplitGate
from cpkv_core.traces.trace import parse_trace_text
from phases import PhaseId
from tests.conftest import make_deploy

runner = CliRunner()

# NOTE: cp 2, page 4: batch 0 is one current-only request of 16 pages (phase 5); batch 1
# continues it by 2 tokens and adds two 1-token requests: history and short requests keep
# it at phase 2 (unsplit under SGLang's gate: the 1-token requests are below 2*cp_size).
TRACE = """\
{"batch": 0, "requests": [{"rid": "a", "prefix_len": 0, "extend_len": 64}]}
{"batch": 1, "requests": [{"rid": "a", "prefix_len": 64, "extend_len": 2},
 {"rid": "b", "prefix_len": 0, "extend_len": 1}, {"rid": "c", "prefix_len": 0, "extend_len": 1}]}
""".replace("\n ", " ")
ALL = frozenset(PhaseId)


def test_shares_count_batches_and_tokens_of_the_chosen_phase() -> None:
    trace = parse_trace_text(TRACE, 4)
    mix = explain_trace(trace.batches, ALL, make_deploy(cp_size=2, page_size=4)).mix()
    shares = {s.phase: (s.batches, s.tokens, s.batch_share, s.token_share) for s in mix.shares}
    assert (mix.batches, mix.tokens) == (2, 68)
    assert shares[5] == (1, 64, 0.5, 64 / 68)
    assert shares[2] == (1, 4, 0.5, 4 / 68)
    assert all(shares[p][0] == 0 for p in (0, 1, 3, 4))


def test_fallbacks_count_batches_per_code_for_enabled_phases_only() -> None:
    trace = parse_trace_text(TRACE, 4)
    deploy = make_deploy(cp_size=2, page_size=4, split_gate=SplitGate.SPLIT_ANYWAY)
    report = explain_trace(trace.batches, ALL - {PhaseId.NARROW_OUTPUT}, deploy)
    mix = report.mix()
    assert 1 not in mix.fallbacks  # disabled: not a fallback
    assert mix.fallbacks[3] == {"HAS_HISTORY": 1}
    assert mix.fallbacks[4] == {"SHORT_REQUEST": 1}  # one batch, though three requests
    assert report.summary()["reasons_by_phase"]["4"]["SHORT_REQUEST"] == 3
    assert mix.fallbacks[5]["NEEDS_INACTIVE"] == 1


def test_explain_summary_json_holds_the_mix_and_no_batch_rows(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(TRACE)
    args = ["explain", str(path), "--phases", "all", "--cp-size", "2", "--page-size", "4"]
    result = runner.invoke(app, [*args, "--summary", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert list(doc) == ["deployment", "enabled", "ceiling", "killed", "warnings", "summary"]
    summary = doc["summary"]
    assert [s["phase"] for s in summary["shares"]] == [0, 1, 2, 3, 4, 5]
    assert sum(s["batch_share"] for s in summary["shares"]) == 1.0
    assert summary["fallbacks"]["3"] == {"HAS_HISTORY": 1}
    full = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    assert full["summary"] == summary and len(full["batches"]) == 2


def test_explain_summary_prints_the_mix_table_and_fallbacks(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(TRACE)
    result = runner.invoke(
        app,
        [
            "explain",
            str(path),
            "--phases",
            "all",
            "--cp-size",
            "2",
            "--page-size",
            "4",
            "--summary",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "2 batches, 68 tokens" in result.stdout
    assert "50.0%" in result.stdout and "94.1%" in result.stdout  # 64 / 68 tokens
    assert "phase 3 fell back (batches by code): HAS_HISTORY x1" in result.stdout
    assert "plan: split" not in result.stdout  # no per-batch table
