"""Tables that fit: one line per batch at 100 columns, readable at 80, full text on request."""

from __future__ import annotations

import io
import json

import pytest
from typer.testing import CliRunner

from cpkv.cli import app
from cpkv.common.console import NO_TERMINAL_WIDTH, AppConsole
from cpkv.render.batches import render_demo
from cpkv.render.cells import compact_reasons, human_bytes, short_bytes
from cpkv.run.explain import explain_trace
from cpkv.run.jobs import Backend
from cpkv.run.verify import verify_levels
from cpkv_core.config import SplitGate, model_preset
from phases.ids import PhaseId
from tests.conftest import DATA, make_deploy, mixed_trace

runner = CliRunner()
ALL = frozenset(PhaseId)
# NOTE: these tables show the split's reasons (SHORT, UNALIGNED, OWNER): under SGLang's gate
# every batch of the mixed trace runs unsplit at cp 2, so they split anyway.
MIXED = ["--phases", "all", "--cp-size", "2", "--page-size", "4", "--cp-split-gate", "split-anyway"]


@pytest.mark.parametrize(
    ("num", "text"),
    [
        (0, "0"),
        (980, "980B"),
        (1424, "1.39K"),
        (29_900, "29.2K"),
        (470_000, "459K"),
        (2_240_000, "2.14M"),
        (3 * 2**30, "3.00G"),
    ],
)
def test_short_bytes_fit_in_five_characters(num: int, text: str) -> None:
    assert short_bytes(num) == text
    assert len(text) <= 5


@pytest.mark.parametrize(
    ("num", "text"),
    [
        (1000, "1000 B"),
        (10 * 1024, "10.0 KiB"),
        (3 * 2**20, "3.0 MiB"),
        (5 * 2**30, "5.0 GiB"),
        (2500 * 2**30, "2500.0 GiB"),
    ],
)
def test_human_bytes_use_binary_units(num: int, text: str) -> None:
    """KiB, MiB and GiB are powers of 1024 (``cpkv plan``'s bytes per token, bench's tables)."""
    assert human_bytes(num) == text


def test_compact_reasons_count_codes_per_phase_and_leave_out_disabled() -> None:
    deploy = make_deploy(cp_size=2, page_size=4, split_gate=SplitGate.SPLIT_ANYWAY)
    report = explain_trace(mixed_trace(4).batches, ALL, deploy)
    assert compact_reasons(report.plans[0]) == "4:SHORT×2 5:UNALIGNED×2"
    assert compact_reasons(report.plans[1]) == "3:HAS_HISTORY×2 4:SHORT×2 5:OWNER,UNALIGNED×2"
    only_3 = explain_trace(mixed_trace(4).batches, frozenset({PhaseId.CURRENT_REUSE}), deploy)
    assert compact_reasons(only_3.plans[0]) == "3:NEEDS"  # its only reason, so it shows


def _stdout(args: list[str], columns: int | None) -> list[str]:
    env = {"COLUMNS": "" if columns is None else str(columns)}
    result = runner.invoke(app, args, env=env)
    assert result.exit_code == 0, result.output
    return [line.rstrip() for line in result.stdout.splitlines()]


def _rows(lines: list[str], header: str) -> list[str]:
    """The body lines of the table whose header line starts with ``header``."""
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    body = lines[start + 2 :]  # header, rule
    return body[: next(i for i, line in enumerate(body) if not line.startswith(" "))]


def test_explain_shows_one_line_per_batch_at_100_columns() -> None:
    lines = _stdout(["explain", str(DATA / "mixed.jsonl"), *MIXED], 100)
    header = next(line for line in lines if line.startswith("batch"))
    assert header.split() == ["batch", "tokens", "phase", "plan", "fallback", "reasons"]
    rows = _rows(lines, "batch")
    assert [row.split()[0] for row in rows] == ["0", "1", "2", "3"]
    assert "3:HAS_HISTORY×2 4:SHORT×2 5:OWNER,UNALIGNED×2" in rows[1]
    assert max(map(len, lines[: lines.index(rows[-1]) + 1])) <= 100
    legend = lines[lines.index(rows[-1]) + 1 :]
    assert any("OWNER = OWNER_MISMATCH" in line for line in legend)
    assert any("--batch N" in line for line in legend)


def test_explain_stays_readable_at_80_columns() -> None:
    lines = _stdout(["explain", str(DATA / "mixed.jsonl"), *MIXED], 80)
    assert all(len(line) <= 80 for line in lines)
    header = next(line for line in lines if line.startswith("batch"))
    assert header.split() == ["batch", "tokens", "phase", "plan", "fallback", "reasons"]
    rows = _rows(lines, "batch")
    starts = [row.split()[0] for row in rows if not row.startswith(" " * len("batch"))]
    assert starts == ["0", "1", "2", "3"]  # a long reason cell wraps under its column
    cell = "".join(row[header.index("fallback") :].strip() for row in rows[1:3])
    assert cell.startswith("3:HAS_HISTORY×2 4:SHORT×2")


def test_verify_shows_one_line_per_level_and_batch_at_100_columns() -> None:
    args = ["verify", str(DATA / "mixed.jsonl"), *MIXED, "--backend", "local"]
    lines = _stdout(args, 100)
    rows = _rows(lines, "level")
    assert [tuple(row.split()[:2]) for row in rows] == [
        (str(level), str(batch)) for level in range(6) for batch in range(4)
    ]
    assert all(len(row) <= 100 for row in rows)
    assert lines[-1].startswith("OK:")


def test_demo_table_keeps_each_batch_on_one_line_at_the_no_terminal_width(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    deploy = make_deploy(cp_size=2, page_size=4)
    batches = mixed_trace(4).batches
    report = verify_levels(model_preset("tiny"), deploy, batches, (0, 5), ALL, Backend.LOCAL)
    buffer = io.StringIO()
    console = AppConsole(file=buffer, soft_wrap=True)
    assert console.width == NO_TERMINAL_WIDTH
    render_demo(console, report, deploy)
    lines = [line.rstrip() for line in buffer.getvalue().splitlines()]
    header = next(line for line in lines if line.startswith("batch"))
    assert header.split() == [
        "batch", "tokens", "phase", "gathered", "KV/rank", "max|diff|", "fallback", "reasons"
    ]  # fmt: skip
    rows = _rows(lines, "batch")
    assert [row.split()[0] for row in rows] == ["0", "1", "2", "3"]
    assert all("→" in row for row in rows)


def test_console_width_is_columns_or_120_when_not_a_terminal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    assert AppConsole(file=io.StringIO()).width == NO_TERMINAL_WIDTH == 120
    monkeypatch.setenv("COLUMNS", "90")
    assert AppConsole(file=io.StringIO()).width == 90


def test_console_width_follows_columns_set_after_the_console_was_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # NOTE: the CLI's consoles are made at import; whichever COLUMNS held then must not stick
    # (under pytest-xdist an 80-column test imported cpkv first and later tables wrapped).
    monkeypatch.setenv("COLUMNS", "80")
    made_at_80 = AppConsole(file=io.StringIO())
    monkeypatch.setenv("COLUMNS", "100")
    assert made_at_80.width == made_at_80.size.width == 100
    monkeypatch.delenv("COLUMNS")
    assert made_at_80.width == NO_TERMINAL_WIDTH
    assert AppConsole(file=io.StringIO(), width=70).width == 70
    made_at_80.width = 60
    assert made_at_80.size.width == 60


def test_explain_batch_shows_every_reason_in_full_and_as_json() -> None:
    args = ["explain", str(DATA / "mixed.jsonl"), *MIXED]
    text = "\n".join(_stdout([*args, "--batch", "1"], 100))
    assert "OWNER_MISMATCH rid=a page=9 owner=1 compute_owner=0" in text
    assert "HAS_HISTORY rid=d prefix_len=32" in text
    one = json.loads(runner.invoke(app, [*args, "--batch", "1", "--json"]).stdout)
    whole = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    assert one == whole["batches"][1]


def test_explain_batch_that_is_not_in_the_trace_exits_2() -> None:
    result = runner.invoke(app, ["explain", str(DATA / "mixed.jsonl"), *MIXED, "--batch", "9"])
    assert result.exit_code == 2
    assert "--batch 9" in result.stderr and "0, 1, 2, 3" in result.stderr
