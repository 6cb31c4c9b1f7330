"""A bounded fuzz run over every input cpkv reads; only results or clear errors pass."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

import cpkv.commands.flags as flag_commands
import cpkv.run.fuzz as fuzz_mod
from cpkv.cli import app
from cpkv.run.fuzz import MIN_CASES, run_fuzz
from flags import ConfigChange, FlagError
from flags.sglang.batch import batch_from_forward_batch

runner = CliRunner()


def test_bounded_fuzz_run_finds_no_failure() -> None:
    report = run_fuzz(app, 3.0, seed=1)
    doc = report.to_json()
    assert doc["ok"], doc["targets"]
    assert set(doc["targets"]) == {
        "trace",
        "config",
        "flags",
        "from-sglang",
        "forward-batch",
        "enable-disable",
    }
    # NOTE: every target runs MIN_CASES at least, whatever the load (a worker beside another
    # once spent the trace target's share before its first case).
    least = dict.fromkeys(doc["targets"], MIN_CASES)
    assert all(t["cases"] >= least[n] for n, t in doc["targets"].items()), doc["targets"]


def test_a_spent_share_still_runs_the_minimum_of_cases() -> None:
    report = run_fuzz(app, 0.0, seed=1, only={"trace"}).to_json()
    assert report["ok"] and report["targets"]["trace"]["cases"] == MIN_CASES


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


@pytest.mark.parametrize("bug", ["crash", "half-written"])
def test_enable_disable_fuzz_reports_a_crash_or_a_half_written_file(
    bug: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The enable/disable target fails on a traceback, and on an error that leaves the
    config file changed."""
    real = flag_commands.apply_change

    def broken(change: ConfigChange) -> ConfigChange:
        if bug == "crash":
            raise KeyError("boom")
        change.path.write_text("enable-nsa-prefill", encoding="utf-8")
        raise FlagError("disk full")

    monkeypatch.setattr(flag_commands, "apply_change", broken)
    report = run_fuzz(app, 1.5, seed=4, only={"enable-disable"}).to_json()["targets"][
        "enable-disable"
    ]
    assert report["failures"] > 0
    words = "KeyError" if bug == "crash" else "changed the config file"
    assert any(words in e for e in report["examples"]), report["examples"]
    monkeypatch.setattr(flag_commands, "apply_change", real)
