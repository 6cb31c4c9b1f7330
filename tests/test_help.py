"""Help that reads well: every command's --help is one short paragraph plus option help, and
reads whole at 80 columns."""

from __future__ import annotations

import re
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from cpkv.cli import app
from cpkv.common.help_text import MAX_HELP_CHARS, first_sentence, one_paragraph

runner = CliRunner()
WIDE = 2000
"""Columns so many that nothing wraps: every line break left in the help is a hard one."""
NARROW = {"COLUMNS": "80"}
"""A terminal of 80 columns, as a person's."""
SECTIONS = ("Arguments:", "Options:", "Commands:")


def _commands(group: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command path under a click group (typer may vendor click: duck-typed)."""
    found = []
    for name, command in sorted(group.commands.items()):
        found.append((*path, name))
        if hasattr(command, "commands"):
            found += _commands(command, (*path, name))
    return found


ROOT = typer.main.get_command(app)
COMMANDS = _commands(ROOT)


def _command(path: tuple[str, ...]) -> Any:
    command = ROOT
    for name in path:
        command = command.commands[name]  # type: ignore[attr-defined]
    return command


def test_every_registered_command_is_checked() -> None:
    names = {path[0] for path in COMMANDS}
    assert {"verify", "explain", "phases", "bench", "demo", "pd", "flags", "plan"} <= names
    assert {"enable", "disable"} <= names


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_help_is_one_short_paragraph_and_every_option_has_help(path: tuple[str, ...]) -> None:
    command = _command(path)
    text = command.help or ""
    assert text and text == one_paragraph(text), f"cpkv {' '.join(path)}: {text!r}"
    assert len(text) <= MAX_HELP_CHARS and text.endswith("."), text
    assert command.short_help == first_sentence(text)
    for param in command.params:
        if param.name == "help":
            continue
        help_text = getattr(param, "help", None)
        assert help_text, f"cpkv {' '.join(path)} {param.name}: no help"
        assert "\n" not in help_text, f"cpkv {' '.join(path)} {param.name}: {help_text!r}"


def _texts_on_one_line(output: str, texts: list[str]) -> list[str]:
    """The ``texts`` that no single line of ``output`` holds whole: at a width where nothing
    wraps, each one was broken by a line break taken from the source."""
    lines = [" ".join(line.split()) for line in output.splitlines()]
    return [text for text in texts if not any(text in line for line in lines)]


@pytest.mark.parametrize("path", [(), *COMMANDS], ids=lambda p: " ".join(p) or "cpkv")
def test_rendered_help_has_no_mid_sentence_breaks(path: tuple[str, ...]) -> None:
    result = runner.invoke(app, [*path, "--help"], terminal_width=WIDE)
    assert result.exit_code == 0, result.output
    lines = [line.rstrip() for line in result.output.splitlines()]
    usage = next(i for i, line in enumerate(lines) if line.strip().startswith("Usage:"))
    section = next(i for i, line in enumerate(lines) if line in SECTIONS)
    description = [line.strip() for line in lines[usage + 1 : section] if line.strip()]
    assert len(description) == 1, description  # one paragraph, on one line
    command = _command(path)
    texts = [" ".join(str(p.help).split()) for p in command.params if getattr(p, "help", None)]
    if path:
        assert description == [command.help]
    else:
        texts += [c.short_help for c in command.commands.values() if not c.hidden]
    assert _texts_on_one_line(result.output, texts) == []


def _names_cut(output: str, names: list[str]) -> list[str]:
    """The option ``names`` that ``output`` does not show whole (as a word of their own)."""
    return [n for n in names if not re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", output)]


@pytest.mark.parametrize("path", [(), *COMMANDS], ids=lambda p: " ".join(p) or "cpkv")
def test_help_at_80_columns_shows_every_option_name_whole(path: tuple[str, ...]) -> None:
    result = runner.invoke(app, [*path, "--help"], env=NARROW)
    assert result.exit_code == 0, result.output
    too_wide = [line for line in result.output.splitlines() if len(line) > 80]
    assert too_wide == [] and "…" not in result.output, result.output
    command = _command(path)
    options = [p for p in command.params if p.param_type_name == "option"]
    names = [name for p in options for name in (*p.opts, *p.secondary_opts)] + ["--help"]
    assert _names_cut(result.output, names) == [], result.output
    help_line = re.compile(r"^  --help +Show this message and exit\.$", re.MULTILINE)
    assert help_line.search(result.output), result.output  # a flag: no value type shown
