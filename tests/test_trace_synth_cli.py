"""``cpkv trace synth``: same bytes for a seed, traces that verify and explain accept as is,
the requests file, and bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cpkv.cli import app
from cpkv.synth import read_requests_file, schedule, trace_text
from cpkv.synth.scheduler import SchedulerConfig
from cpkv_core.traces.trace import load_trace

runner = CliRunner()


def synth(tmp_path: Path, name: str, *args: str) -> tuple[Path, dict[str, Any]]:
    out = tmp_path / name
    result = runner.invoke(app, ["trace", "synth", *args, "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    summary: dict[str, Any] = json.loads(result.stdout)
    return out, summary


def test_same_seed_same_bytes_and_a_valid_trace(tmp_path: Path) -> None:
    first, summary = synth(tmp_path, "a.jsonl", "--workload", "long-doc", "--seed", "1")
    second, _ = synth(tmp_path, "b.jsonl", "--workload", "long-doc", "--seed", "1")
    third, _ = synth(tmp_path, "c.jsonl", "--workload", "long-doc", "--seed", "2")
    assert first.read_bytes() == second.read_bytes() != third.read_bytes()
    trace = load_trace(first, 64)
    assert len(trace.batches) == summary["batches"]
    assert sum(b.num_tokens for b in trace.batches) == summary["computed_tokens"]
    assert summary["scheduler"] == {
        "page_size": 64,
        "chunked_prefill_size": 8192,
        "max_prefill_tokens": 16384,
        "kv_cache_sharding": False,
    }


def test_small_chat_verifies_at_every_level_on_four_ranks(tmp_path: Path) -> None:
    trace, _ = synth(tmp_path, "chat.jsonl", "--workload", "chat", "--size", "small")
    result = runner.invoke(
        app,
        ["verify", str(trace), "--phases", "all", "--cp-size", "4", "--backend", "local", "--json"],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["ok"] and [lv["level"] for lv in report["levels"]] == [0, 1, 2, 3, 4, 5]


def test_scheduler_options_override_the_preset_and_shape_the_trace(tmp_path: Path) -> None:
    trace, summary = synth(
        tmp_path,
        "t.jsonl",
        "--workload",
        "long-doc",
        "--size",
        "small",
        "--chunked-prefill-size",
        "1000",
        "--max-prefill-tokens",
        "3000",
    )
    assert summary["scheduler"]["chunked_prefill_size"] == 1000
    assert summary["mid_page_resumes"] > 0
    assert max(b.num_tokens for b in load_trace(trace, 64).batches) <= 1000


def test_mid_page_resumes_are_counted_at_the_page_size_asked_for(tmp_path: Path) -> None:
    """Chunks of 1,000 tokens resume mid-page at page 16 less often than at 64 (2,000 is a
    multiple of 16): the summary counts them at ``--page-size``, as the trace reads."""
    args = ["--workload", "long-doc", "--size", "small", "--chunked-prefill-size", "1000"]
    trace, summary = synth(tmp_path, "t.jsonl", *args, "--page-size", "16")

    def resumes(page: int) -> int:
        batches = load_trace(trace, 16).batches
        return sum(r.prefix_len % page != 0 for b in batches for r in b.requests)

    assert summary["scheduler"]["page_size"] == 16
    assert summary["mid_page_resumes"] == resumes(16) != resumes(64)


def test_bench_serving_shapes_take_their_own_options(tmp_path: Path) -> None:
    _, gsp = synth(
        tmp_path,
        "g.jsonl",
        "--workload",
        "generated-shared-prefix",
        "--gsp-num-groups",
        "2",
        "--gsp-prompts-per-group",
        "3",
        "--gsp-system-prompt-len",
        "300",
        "--gsp-question-len",
        "40",
        "--max-concurrency",
        "1",
    )
    assert (gsp["requests"], gsp["prompt_tokens"], gsp["batches"]) == (6, 6 * 340, 6)
    # NOTE: one at a time, each group's later prompts hit its 4 whole system-prompt pages.
    assert gsp["cached_tokens"] == 4 * 256
    _, rnd = synth(
        tmp_path,
        "r.jsonl",
        "--workload",
        "random",
        "--num-prompts",
        "5",
        "--random-input-len",
        "200",
        "--random-range-ratio",
        "1",
    )
    assert (rnd["requests"], rnd["prompt_tokens"], rnd["cached_tokens"]) == (5, 1000, 0)


REQUESTS = """\
{"prompt_len": 300}
{"prompt_len": 900, "prefix_group": "bot", "prefix_len": 640}
{"prompt_len": 700, "session": "u1"}
{"prompt_len": 950, "prefix_group": "bot", "prefix_len": 640}
{"prompt_len": 1000, "session": "u1"}
"""


def test_requests_file_shares_group_prefixes_and_grows_sessions(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    path.write_text(REQUESTS)
    workload = read_requests_file(path)
    turns = {t.rid: t for s in workload.sessions for t in s.turns}
    assert sorted(turns) == ["req1", "req2", "req4", "u1-t0", "u1-t1"]
    assert turns["u1-t1"].segments[: len(turns["u1-t0"].segments)] == turns["u1-t0"].segments
    config = SchedulerConfig(chunked_prefill_size=1024, max_prefill_tokens=1024)
    batches = schedule(workload, config)
    hits = {r.rid: (r.prefix_len, r.prefix_from) for b in batches for r in b.requests}
    assert hits["req4"] == (640, "req2")
    assert hits["u1-t1"] == (640, "u1-t0")
    assert load_trace(_write(tmp_path, trace_text(batches)), 64)


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "out.jsonl"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ('{"prompt_len": 0}', "2: prompt_len: Input should be greater than or equal to 1"),
        (
            '{"prompt_len": 10, "prefix_group": "g"}',
            "2: line: prefix_group and prefix_len go together",
        ),
        (
            '{"prompt_len": 10, "prefix_group": "g", "prefix_len": 20}',
            "2: line: prefix_len=20 exceeds prompt_len=10",
        ),
        ('{"prompt_len": 10, "tokens": 3}', "2: tokens: Extra inputs are not permitted"),
        ('{"prompt_len": 5, "session": "u1"}', "2: prompt_len: a later turn of session 'u1'"),
        (
            '{"prompt_len": 20, "session": "u1", "prefix_group": "g", "prefix_len": 4}',
            "2: prefix_group: only a session's first turn names one",
        ),
    ],
)
def test_requests_file_errors_name_the_line_and_field(
    tmp_path: Path, line: str, words: str
) -> None:
    path = tmp_path / "requests.jsonl"
    path.write_text('{"prompt_len": 10, "session": "u1"}\n' + line + "\n")
    result = runner.invoke(
        app,
        [
            "trace",
            "synth",
            "--workload",
            "requests",
            "--requests",
            str(path),
            "--out",
            str(tmp_path / "t.jsonl"),
        ],
    )
    assert result.exit_code == 2, result.output
    assert f"{path}:{words}" in result.stderr


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (
            ["--workload", "chat", "--gsp-num-groups", "2"],
            "--gsp-num-groups need --workload generated-shared-prefix",
        ),
        (["--workload", "random", "--size", "small"], "--size applies to the presets"),
        (["--workload", "chat", "--requests", "x.jsonl"], "--requests needs --workload requests"),
        (["--workload", "requests"], "--workload requests needs --requests PATH"),
        (
            ["--workload", "chat", "--chunked-prefill-size", "32"],
            "chunked_prefill_size must be -1 (off) or at least one page",
        ),
        (["--workload", "chat", "--max-concurrency", "0"], "--max-concurrency must be >= 1"),
        (
            ["--workload", "generated-shared-prefix", "--gsp-num-groups", "0"],
            "num_groups: Input should be greater than or equal to 1",
        ),
        (
            ["--workload", "random", "--random-range-ratio", "1.5"],
            "range_ratio: Input should be less than or equal to 1",
        ),
    ],
)
def test_rejects_options_for_another_workload_or_out_of_range(
    tmp_path: Path, args: list[str], words: str
) -> None:
    result = runner.invoke(app, ["trace", "synth", *args, "--out", str(tmp_path / "t.jsonl")])
    assert result.exit_code == 2, result.output
    assert words in result.stderr
    assert not (tmp_path / "t.jsonl").exists()
