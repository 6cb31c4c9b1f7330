"""A bounded fuzz run over every input cpkv reads; only results or clear errors pass."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

import cpkv.fuzz as fuzz_mod
from cpkv.cli import app
from cpkv.fuzz import run_fuzz
from flags import FlagError
from flags.sglang_batch import batch_from_forward_batch

runner = CliRunner()


def test_bounded_fuzz_run_finds_no_failure() -> None:
    report = run_fuzz(4.0, seed=1)
    doc = report.to_json()
    assert doc["ok"], doc["targets"]
    assert set(doc["targets"]) == {"trace", "config", "flags", "from-sglang", "forward-batch"}
    assert all(t["cases"] >= 50 for t in doc["targets"].values()), doc["targets"]


def test_fuzz_command_reports_a_crash_as_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    """A target that raises anything but ValueError fails the run (exit 1), named."""

    def crashing(text: str, page_size: int) -> None:
        raise KeyError("boom")

    monkeypatch.setattr(fuzz_mod, "parse_trace_text", crashing)
    result = runner.invoke(app, ["fuzz", "--minutes", "0.02", "--seed", "3", "--json"])
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    assert doc["targets"]["trace"]["failures"] > 0
    assert doc["targets"]["trace"]["examples"][0].startswith("KeyError")
    assert doc["targets"]["config"]["failures"] == 0


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"extend_prefix_lens_cpu": 0, "extend_seq_lens_cpu": [1]}, "must be a list of ints"),
        (
            {"extend_prefix_lens_cpu": [0], "extend_seq_lens_cpu": [3.7]},
            r"extend_seq_lens_cpu\[0\]",
        ),
        ({"extend_prefix_lens_cpu": [0], "extend_seq_lens_cpu": [1], "rids": 5}, "rids must be"),
    ],
)
def test_adapter_refuses_malformed_fields_clearly(fields: dict[str, object], words: str) -> None:
    """Found by the fuzzer: these raised TypeError (or truncated 3.7 to 3) before."""
    with pytest.raises(FlagError, match=words):
        batch_from_forward_batch(SimpleNamespace(**fields))
