"""``cpkv flags`` and ``cpkv plan`` agree with SGLang 0.5.23 on a corpus of launch commands.

``tests/data/sglang_corpus.jsonl`` holds realistic and broken launch commands, each with
SGLang's own verdict: its argparse and ``ServerArgs.resolve_once()`` were run from the pinned
wheel on a CPU machine made to look like one H200 node (SGLang's ``override_platform`` with
sm90 facts, CUDA-only kernel packages stubbed, the models' ``config.json`` files local).
``parse_error`` is SGLang's argparse exiting 2, ``refused`` an error raised by its resolution
(``where`` names the file), ``ok`` the resolved fields. A seed-series command carries the
verdict of its 0.5.23 spelling too (``translated``): cpkv reads it with a warning.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner
from typer.main import get_command

from cpkv.cli import app as cli_app
from flags import SGLANG_VERSION

CORPUS = [
    json.loads(line)
    for line in (Path(__file__).parent / "data" / "sglang_corpus.jsonl").read_text().splitlines()
]
PLANNED_MODELS = ("deepseek-ai/DeepSeek-V3.2", "zai-org/GLM-5")
"""Model paths ``cpkv plan`` has a preset for (GLM-5-FP8 included)."""

runner = CliRunner()


@pytest.fixture(scope="module")
def app() -> click.Command:
    """The CLI as a click command, built once: typer builds it anew on every invoke."""
    return get_command(cli_app)


def _truth(row: dict[str, Any]) -> dict[str, Any]:
    truth: dict[str, Any] = row.get("sglang_translated") or row["sglang"]
    return truth


def _sglang_problems(document: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in document["problems"] if p["source"].startswith(f"sglang {SGLANG_VERSION}")]


@pytest.mark.parametrize("row", CORPUS, ids=[row["id"] for row in CORPUS])
def test_cpkv_flags_gives_sglang_s_verdict(app: click.Command, row: dict[str, Any]) -> None:
    result = runner.invoke(app, ["flags", "--from-sglang", row["command"], "--json"])
    truth = _truth(row)
    if truth["verdict"] == "parse_error":
        assert result.exit_code == 2, result.output
        return
    document = json.loads(result.stdout)
    if "translated" in row:
        assert document["warnings"], "a seed-series name read without a warning"
    problems = _sglang_problems(document)
    if truth["verdict"] == "refused":
        assert result.exit_code == 1 and problems, document["problems"]
        if "/arg_groups/" in truth["where"]:
            assert any(p["source"].endswith(truth["where"]) for p in problems), (
                truth["where"],
                problems,
            )
        return
    assert result.exit_code == 0 and not document["problems"], document["problems"]
    resolved = document["sglang"]["resolved"]
    assert {k: resolved[k] for k in truth["resolved"]} == truth["resolved"]
    cp_size = resolved["attn_cp_size"] if resolved["enable_prefill_cp"] else 1
    assert document["sglang"]["cp_size"] == cp_size


@pytest.mark.parametrize("row", CORPUS, ids=[row["id"] for row in CORPUS])
def test_cpkv_plan_gives_the_same_answer(app: click.Command, row: dict[str, Any]) -> None:
    args = ["plan", "--gpu-mem-gib", "4096", "--from-sglang", row["command"], "--json"]
    result = runner.invoke(app, args)
    truth = _truth(row)
    if truth["verdict"] != "ok":
        assert result.exit_code == 2, result.output
        if truth["verdict"] == "refused":
            assert "SGLang would refuse" in result.stderr
        return
    if not any(
        f"--model-path {m}" in row["command"] or f"--model {m}" in row["command"]
        for m in PLANNED_MODELS
    ):
        assert result.exit_code == 2 and "maps to no preset" in result.stderr
        return
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    resolved = truth["resolved"]
    cp_size = resolved["attn_cp_size"] if resolved["enable_prefill_cp"] else 1
    assert (document["cp_size"], document["tp_size"], document["page_size"]) == (
        cp_size,
        resolved["tp_size"],
        resolved["page_size"],
    )
