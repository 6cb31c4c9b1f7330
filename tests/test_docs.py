"""Docs that match the code.

- ``docs/cli.md`` and ``docs/flags.md`` hold blocks generated from the typer app and the flag
  model; they must equal what ``cpkv docs`` generates now.
- Every command line in the README and ``docs/`` runs and exits as documented. A command line
  is a ``$ cpkv ...`` line in a fenced code block (leading ``NAME=value`` words set the
  environment; a trailing ``# exit N`` states a non-zero exit code). The lines of one block
  run in order in one scratch directory that sees the repository's ``tests/`` and ``cpkv/``.
  Lines that spawn process groups (``demo``, ``bench``, ``pd``) are not run again here: each
  must be listed in ``COVERED`` with the test that runs that command on small inputs.
- Every other ``cpkv ...`` in the docs (inline, or a usage line) names a real command and only
  options that command has.
"""

from __future__ import annotations

import importlib
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from cpkv.cli import app
from cpkv.commands.docs import BLOCK, StaleDocs, fill_blocks, render_docs

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
runner = CliRunner()

COVERED = {
    "cpkv demo": "tests/test_cli.py::test_demo_runs_every_level_and_pd_and_reports_a_verdict",
    "cpkv bench --out plots": "tests/test_bench_cli.py::test_gloo_sections_report_their_figures",
    "cpkv bench --repeats 1 --json": (
        "tests/test_bench_cli.py::test_host_and_byte_sections_report_their_figures"
    ),
    "cpkv bench --rows deepseek-v3.2 --rows-grid tiny --repeats 1 --json": (
        "tests/test_bench_rows.py::test_every_figure_moves_the_bytes_counted_by_hand"
    ),
    "cpkv pd tests/data/pd_small.jsonl --phases 1,2 --cp-size 2 --page-size 4": (
        "tests/test_cli.py::test_pd_json_round_trips"
    ),
    "cpkv pd tests/data/mixed.jsonl --phases all --cp-size 2 --page-size 4 --json": (
        "tests/test_cli.py::test_pd_json_round_trips"
    ),
    "cpkv pd tests/data/long.jsonl --phases all --cp-size 4 --decode-cp-size 2 --json": (
        "tests/test_cli.py::test_pd_json_round_trips"
    ),
    "cpkv verify tests/data/mixed.jsonl --phases all --cp-size 2 --page-size 4 --materialize "
    "peer-read --backend gloo --json": (
        "tests/test_peer_read.py::"
        "test_verify_peer_read_on_gloo_is_ok_at_every_level_with_no_history_collective"
    ),
    "cpkv verify tests/data/mixed.jsonl --phases all --cp-size 4 --page-size 4 --device meta": (
        "tests/test_cli.py::test_verify_on_meta_runs_every_level_on_shapes_alone"
    ),
}
"""Doc command lines that spawn gloo groups or a decode process, and the test that runs the
same command on small inputs (``--backend local``, a small trace); the suite runs each once."""
SPAWNING = {"demo", "bench", "pd"}
"""Commands that always spawn processes (``verify`` does unless ``--backend local``)."""


@dataclass(frozen=True)
class Line:
    """One ``$ cpkv ...`` line: where it is, its environment, arguments and exit code."""

    where: str
    text: str
    env: dict[str, str]
    args: list[str]
    exit_code: int


def _fences(text: str) -> list[list[str]]:
    """The lines of every fenced code block."""
    blocks, current = [], None
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            if current is None:
                current = []
            else:
                blocks.append(current)
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def _parse(where: str, text: str) -> Line:
    command, _, comment = text.partition("#")
    words = shlex.split(command)
    env = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    assert words and words[0] == "cpkv", f"{where}: not a cpkv command: {text!r}"
    exit_match = re.fullmatch(r"\s*exit (\d)\s*", comment)
    assert not comment or exit_match, f"{where}: a comment must be '# exit N': {text!r}"
    exit_code = int(exit_match.group(1)) if exit_match else 0
    return Line(where, " ".join(words), env, words[1:], exit_code)


def _sessions() -> list[list[Line]]:
    """Every block's ``$ cpkv`` lines, one list per block."""
    sessions = []
    for page in PAGES:
        for i, block in enumerate(_fences(page.read_text())):
            where = f"{page.relative_to(ROOT)} block {i + 1}"
            lines = [_parse(where, line.strip()[2:]) for line in block if line.startswith("$ ")]
            if lines:
                sessions.append(lines)
    return sessions


SESSIONS = _sessions()


def _spawns(line: Line) -> bool:
    """Whether the line starts process groups; bad input (exit 2) is refused before that."""
    if line.exit_code == 2:
        return False
    command = line.args[0]
    local = "--backend" in line.args and "local" in line.args
    return command in SPAWNING or (command == "verify" and not local)


def test_docs_have_runnable_command_lines() -> None:
    lines = [line for session in SESSIONS for line in session]
    assert len(lines) >= 15
    pages = {line.where.split(" block")[0] for line in lines}
    assert {"README.md", "docs/cli.md", "docs/capacity.md"} <= pages


@pytest.mark.parametrize("session", SESSIONS, ids=lambda s: s[0].where)
def test_every_command_line_exits_as_documented(
    session: list[Line], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("tests", "cpkv"):
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)
    for line in session:
        if _spawns(line):
            assert line.text in COVERED, (
                f"{line.where}: `{line.text}` spawns processes: add it to COVERED with the "
                "test that runs it on small inputs"
            )
            continue
        env = {"CPKV_CONFIG": None, "COLUMNS": "100", **line.env}
        result = runner.invoke(app, line.args, env=env)  # type: ignore[arg-type]
        assert result.exit_code == line.exit_code, (
            f"{line.where}: `{line.text}` exited {result.exit_code}, documented "
            f"{line.exit_code}\n{result.output}"
        )


def test_covered_command_lines_name_tests_that_exist() -> None:
    documented = {line.text for session in SESSIONS for line in session}
    assert set(COVERED) <= documented, set(COVERED) - documented
    for node in COVERED.values():
        path, _, name = node.partition("::")
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        assert callable(getattr(module, name, None)), node


MENTION = re.compile(r"cpkv [a-z][a-z-]*(?: .*)?")
"""``cpkv`` and a command word: not output such as ``cpkv demo: 6 batches``."""


def _mentions() -> list[tuple[str, str]]:
    """Every ``cpkv ...`` the docs name that is not a ``$`` line: inline spans, usage lines."""
    found = []
    for page in PAGES:
        text = page.read_text()
        where = str(page.relative_to(ROOT))
        spans = [" ".join(span.split()) for span in re.findall(r"`(cpkv [^`]+)`", text)]
        usage = [line.strip() for block in _fences(text) for line in block]
        found += [(where, t) for t in spans + usage if MENTION.fullmatch(t)]
    return found


COMMANDS = typer.main.get_command(app).commands  # type: ignore[attr-defined]


@pytest.mark.parametrize(("where", "text"), _mentions(), ids=lambda v: str(v))
def test_every_mentioned_command_and_option_exists(where: str, text: str) -> None:
    words = text.replace("/", " ").split()
    name = words[1]
    assert name in COMMANDS, f"{where}: `{text}` names no command"
    command, rest = COMMANDS[name], words[2:]
    while rest and rest[0] in getattr(command, "commands", {}):  # a sub-app: cpkv trace synth
        command, rest = command.commands[rest[0]], rest[1:]
    options = {opt for p in command.params for opt in p.opts}
    named = {w.split("=")[0].strip("[]") for w in rest if w.strip("[").startswith("--")}
    assert named <= options, f"{where}: `{text}`: {sorted(named - options)} not options of {name}"


def test_generated_reference_blocks_match_the_code() -> None:
    for path, text in render_docs(app, ROOT / "docs").items():
        assert path.read_text() == text, f"{path} is stale: run `cpkv docs` and commit"


def test_a_command_without_a_block_or_a_block_without_a_command_is_stale() -> None:
    empty = "<!-- BEGIN GENERATED {0} (cpkv docs) -->\n<!-- END GENERATED {0} -->\n"
    with pytest.raises(StaleDocs, match=r"code with no block: \['cpkv plan'\]"):
        fill_blocks(empty.format("cpkv verify"), {"cpkv verify": "", "cpkv plan": ""}, "x.md")
    with pytest.raises(StaleDocs, match=r"blocks for nothing in the code: \['cpkv gone'\]"):
        fill_blocks(empty.format("cpkv gone"), {}, "x.md")
    filled = fill_blocks(empty.format("a"), {"a": "body\n"}, "x.md")
    assert BLOCK.fullmatch(filled.strip()) and "body" in filled


def test_every_relative_link_and_picture_in_the_docs_exists() -> None:
    missing = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" not in target and not (page.parent / target).exists():
                missing.append(f"{page.relative_to(ROOT)}: {target}")
    assert missing == []
    readme = (ROOT / "README.md").read_text()
    assert "![" in readme and "(docs/capacity.png)" in readme
    assert (ROOT / "docs/capacity.png").read_bytes().startswith(b"\x89PNG")


def test_docs_check_exits_1_on_a_stale_page_and_writes_nothing(tmp_path: Path) -> None:
    """``cpkv docs --check`` is the CI gate: a stale block exits 1 and leaves the page as it
    was; ``cpkv docs`` rewrites it, after which ``--check`` exits 0."""
    for page in ("cli.md", "flags.md"):
        (tmp_path / page).write_text((ROOT / "docs" / page).read_text())
    cli_page = tmp_path / "cli.md"
    begin = "<!-- BEGIN GENERATED cpkv verify (cpkv docs) -->\n"
    stale = cli_page.read_text().replace(begin, begin + "an edit by hand\n")
    assert stale != cli_page.read_text()
    cli_page.write_text(stale)
    checked = runner.invoke(app, ["docs", "--docs-dir", str(tmp_path), "--check"])
    assert checked.exit_code == 1, checked.output
    assert f"stale: {cli_page}" in checked.stderr
    assert cli_page.read_text() == stale
    written = runner.invoke(app, ["docs", "--docs-dir", str(tmp_path)])
    assert written.exit_code == 0, written.output
    assert cli_page.read_text() == (ROOT / "docs" / "cli.md").read_text()
    again = runner.invoke(app, ["docs", "--docs-dir", str(tmp_path), "--check"])
    assert again.exit_code == 0 and again.stderr == ""
