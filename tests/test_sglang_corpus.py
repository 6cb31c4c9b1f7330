"""``cpkv flags`` and ``cpkv plan`` agree with SGLang 0.5.23 on two corpora of launch commands.

Each line holds a realistic or broken launch command with SGLang's own verdict: its argparse
and ``ServerArgs.resolve_once()`` run from the pinned wheel on a CPU machine made to look like
one H200 node (``scripts/sglang_oracle.py``: SGLang's ``override_platform`` with sm90 facts,
143,771 MiB of GPU memory, the models' ``config.json`` files from ``tests/data/models``).
``parse_error`` is SGLang's argparse, launcher or config merger refusing the command line,
``refused`` an error raised by its resolution (``where`` names the file), ``ok`` the resolved
fields. A seed-series command carries the verdict of its 0.5.23 spelling too
(``translated``): cpkv reads it with a warning.

- ``sglang_corpus.jsonl``: CP, attention DP, page size, PD, KV sharding, parser errors and
  seed-series names;
- ``sglang_corpus_b.jsonl``: launcher forms, ``--config`` YAML files
  (``tests/data/sglang_configs``), models read from a folder's ``config.json`` and MLA models
  without DSA, attention-backend page sizes, DCP, attention TP without prefill CP, SGLang's
  boolean environment values, the chunk under attention DP, ``mem_fraction_static`` as
  SGLang derives it (a VLM's vision reserve included), NextN drafts and other architectures
  of the DeepSeek family, HYV4's sinks, HiSparse, encoder disaggregation and
  ``--language-model-only``, ``--quantization`` and ``--context-length`` against the checkpoint,
  model overrides, EPLB and the LM-head layouts. Its ``resolved`` fields also hold the
  attention TP size, the DSA kernels, the chunk and the memory fraction;
- ``sglang_corpus_random.jsonl``: 150 commands drawn at random from the options above and
  others (HiCache, two-batch overlap, speculative decoding, ``--nnodes``), kept to catch
  what nobody thought to write by hand;
- ``sglang_corpus_operator.jsonl``: 542 commands of a CP base with the options operators
  add (quantization, context length, EPLB, LM-head layouts, model overrides, serving knobs):
  the 43 of a draft of ``scripts/sglang_random_commands.py`` that cpkv got wrong before
  their rules, and 499 the script drew afterwards (``--seed 41`` and ``42``).

A command whose EP does not divide its TP starts in SGLang's resolution, which then has no
MoE TP width to build; ``cpkv plan`` refuses it (docs/sglang.md).
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

DATA = Path(__file__).parent / "data"
CORPUS = [
    json.loads(line)
    for name in (
        "sglang_corpus.jsonl",
        "sglang_corpus_b.jsonl",
        "sglang_corpus_random.jsonl",
        "sglang_corpus_operator.jsonl",
    )
    for line in (DATA / name).read_text().splitlines()
]
UNSHARDABLE = ("Qwen/", "qwen3-finetune", "llava-llama")
"""Model paths of GQA models, which ``cpkv plan`` refuses in one sentence."""

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
    """On the H200 SGLang was resolved on, ``plan`` has SGLang's layout, page size, chunk
    and memory fraction; a model too large for it is checked on a 4 TiB GPU."""
    args = ["plan", "--from-sglang", row["command"], "--json"]
    result = runner.invoke(app, args)
    truth = _truth(row)
    if truth["verdict"] != "ok":
        assert result.exit_code == 2, result.output
        if truth["verdict"] == "refused":
            assert "SGLang would refuse" in result.stderr
        return
    if any(model in row["command"] for model in UNSHARDABLE):
        assert result.exit_code == 2 and "cannot shard" in result.stderr, result.output
        return
    resolved = truth["resolved"]
    if resolved["tp_size"] % resolved["ep_size"]:
        # NOTE: SGLang resolves it, then has no MoE TP width to build (docs/sglang.md).
        assert result.exit_code == 2 and "ep_size must divide tp_size" in result.stderr
        return
    on_h200 = result.exit_code == 0
    if not on_h200:
        assert "do not fit" in result.stderr, result.output
        result = runner.invoke(app, [*args, "--gpu-mem-gib", "4096"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    cp_size = resolved["attn_cp_size"] if resolved["enable_prefill_cp"] else 1
    assert (document["cp_size"], document["tp_size"], document["page_size"]) == (
        cp_size,
        resolved["tp_size"],
        resolved["page_size"],
    )
    if "attn_tp_size" in resolved:
        assert document["attn_tp_size"] == resolved["attn_tp_size"]
    if on_h200 and "mem_fraction_static" in resolved:
        memory = document["memory"]
        assert memory["chunked_prefill_size"] == resolved["chunked_prefill_size"]
        assert memory["mem_fraction_static"] == resolved["mem_fraction_static"]
