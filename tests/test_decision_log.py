"""``cpkv explain --decision-log``: a decision log as the SGLang plugin writes it
(``phases.decision_log``), read back with every batch, its tail and the totals; a bad line
is named by its number."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cpkv.cli import app
from phases.decision_log import DecisionRecord, TailRecord, parse_log_line

runner = CliRunner()

RECORDS = (
    DecisionRecord(0, 300, 2, True, True, 1, ()),
    TailRecord(0, "narrow", None, "agreed"),
    DecisionRecord(1, 5, 2, False, False, 0, ("CP_OFF rule=sglang rid=r1 tokens=2 need=8",)),
    TailRecord(1, "stock", "CP_OFF", None),
    DecisionRecord(2, 120, 1, True, True, 0, ("1:RETURN_LOGPROB",)),
    TailRecord(2, "stock", "RETURN_LOGPROB", None),
    DecisionRecord(3, 90, 1, True, False, 0, ("CP_OFF tokens=90 min=100",)),
)


def _write(path: Path, records: tuple[DecisionRecord | TailRecord, ...]) -> Path:
    lines = []
    for record in records:
        kind = "decision" if isinstance(record, DecisionRecord) else "tail"
        lines.append(json.dumps({kind: record.to_json()}))
    path.write_text("\n".join(lines) + "\n")
    return path


def _explain(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, ["explain", *args, "--decision-log"], env={"COLUMNS": "160"})
    return result.exit_code, result.stdout, result.stderr


def test_records_round_trip_through_their_json() -> None:
    for record in RECORDS:
        kind = "decision" if isinstance(record, DecisionRecord) else "tail"
        assert parse_log_line({kind: record.to_json()}) == record


def test_explain_gives_every_batch_with_its_tail_and_the_totals(tmp_path: Path) -> None:
    log = _write(tmp_path / "decisions.jsonl", RECORDS)
    code, stdout, _ = _explain(str(log), "--json")
    assert code == 0
    document = json.loads(stdout)
    assert [b["batch"] for b in document["batches"]] == [0, 1, 2, 3]
    assert document["batches"][3]["tail"] is None
    assert document["totals"] == {
        "batches": 4,
        "batches_by_phase": {"0": 3, "1": 1},
        "tokens_by_phase": {"0": 215, "1": 300},
        "reasons": {"1:RETURN_LOGPROB": 1, "CP_OFF": 2},
        "tail": {"narrow": 1, "stock": 2, "stock:CP_OFF": 1, "stock:RETURN_LOGPROB": 1},
        "shadow": {"agreed": 1},
    }


def test_the_text_table_says_who_ran_a_batch_unsplit(tmp_path: Path) -> None:
    log = _write(tmp_path / "decisions.jsonl", RECORDS)
    code, stdout, _ = _explain(str(log))
    assert code == 0
    assert "no (sglang)" in stdout and "no (cpkv)" in stdout and "narrow (shadow agreed)" in stdout
    assert "4 batches; phase 0: 3 batches, 215 tokens, phase 1: 1 batches, 300 tokens" in stdout


def test_summary_and_one_batch(tmp_path: Path) -> None:
    log = _write(tmp_path / "decisions.jsonl", RECORDS)
    code, stdout, _ = _explain(str(log), "--summary", "--json")
    assert code == 0 and "batches" not in json.loads(stdout)
    code, stdout, _ = _explain(str(log), "--batch", "2", "--json")
    assert code == 0 and json.loads(stdout)["tail"]["reason"] == "RETURN_LOGPROB"
    code, _, stderr = _explain(str(log), "--batch", "9")
    assert code == 2 and "the log has batches 0-3" in stderr


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("not json", "not a decision-log record"),
        ('{"decision": {"batch": 0}}', "needs exactly the fields"),
        (
            '{"tail": {"batch": 0, "gather": "wide", "reason": null, "shadow": null}}',
            "narrow or stock",
        ),
        (
            '{"decision": {"batch": true, "tokens": 1, "requests": 1, "sglang_split": true, '
            '"split": true, "phase": 1, "reasons": []}}',
            "batch has the wrong type",
        ),
        ('{"other": {}}', 'a "decision" or a "tail"'),
        (
            '{"tail": {"batch": 7, "gather": "narrow", "reason": null, "shadow": null}}',
            "never decided",
        ),
    ],
)
def test_a_bad_line_is_named_by_its_number(tmp_path: Path, line: str, words: str) -> None:
    log = _write(tmp_path / "decisions.jsonl", RECORDS[:2])
    log.write_text(log.read_text() + line + "\n")
    code, _, stderr = _explain(str(log))
    assert code == 2 and f"{log}:3" in stderr and words in stderr, stderr


def test_a_batch_decided_twice_is_refused(tmp_path: Path) -> None:
    log = _write(tmp_path / "decisions.jsonl", (RECORDS[0], RECORDS[0]))
    code, _, stderr = _explain(str(log))
    assert code == 2 and "batch 0 is decided twice" in stderr


def test_a_missing_log_is_bad_input(tmp_path: Path) -> None:
    code, _, stderr = _explain(str(tmp_path / "nope.jsonl"))
    assert code == 2 and "cannot read the decision log" in stderr


def test_the_split_column_names_who_ran_each_batch_unsplit(tmp_path: Path) -> None:
    """Batch 1 SGLang left unsplit (``sglang_split`` false): "no (sglang)"; batch 3 SGLang
    would split but cpkv's gate ran it unsplit: "no (cpkv)"; batches 0 and 2 split."""
    log = _write(tmp_path / "decisions.jsonl", RECORDS)
    code, stdout, _ = _explain(str(log))
    assert code == 0
    rows = {}
    for line in stdout.splitlines():
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        if cells and cells[0].isdigit():
            rows[int(cells[0])] = cells[3]
    assert rows == {0: "yes", 1: "no (sglang)", 2: "yes", 3: "no (cpkv)"}


def test_batch_n_is_the_batch_numbered_n_in_a_log_that_starts_later(tmp_path: Path) -> None:
    """A log begun mid-run (the plugin's numbering goes on): ``--batch 5`` is the record
    numbered 5, not the sixth line's; a number the log does not hold is bad input."""
    later = tuple(dataclasses.replace(r, batch=r.batch + 3) for r in RECORDS)
    log = _write(tmp_path / "decisions.jsonl", later)
    code, stdout, _ = _explain(str(log), "--batch", "5", "--json")
    assert code == 0
    document = json.loads(stdout)
    assert (document["batch"], document["tokens"]) == (5, 120)
    assert document["tail"]["batch"] == 5
    code, _, stderr = _explain(str(log), "--batch", "0")
    assert code == 2 and "the log has batches 3-6" in stderr
