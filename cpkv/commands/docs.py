"""Reference docs generated from the code: ``docs/cli.md`` from the typer app, ``docs/flags.md``
from the flag model's field docs. The entry point is :func:`render_docs`.

A generated block sits between two markers in the hand-written page::

    <!-- BEGIN GENERATED cpkv verify (cpkv docs) -->
    ...
    <!-- END GENERATED cpkv verify -->

``cpkv docs`` rewrites every block; a test fails while a committed block differs from what
the code generates, while a command has no block, or while a block names no command.
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Callable, Iterator
from enum import Enum
from pathlib import Path
from typing import Any

import typer

from flags import FLAG_SPECS, FlagSet

BLOCK = re.compile(
    r"(?P<begin><!-- BEGIN GENERATED (?P<name>[^()]+?) \(cpkv docs\) -->\n)"
    r"(?P<body>.*?)"
    r"(?P<end><!-- END GENERATED (?P=name) -->)",
    re.DOTALL,
)
"""One generated block; its ``name`` says what fills it."""
CLI_PAGE = "cli.md"
FLAGS_PAGE = "flags.md"
TYPE_WORDS = {int: "INT", float: "FLOAT", str: "TEXT", Path: "PATH", bool: ""}
"""Metavar of an option by value type, unless the option names its own."""


class StaleDocs(ValueError):
    """A page's generated blocks do not match the code, or a block or command is missing."""


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _value_type(callback: Callable[..., Any], name: str) -> Any:
    """The value type of parameter ``name``: ``Annotated``, ``| None`` and ``list[]`` removed."""
    hint = typing.get_type_hints(callback, include_extras=True)[name]
    if typing.get_origin(hint) is typing.Annotated:
        hint = typing.get_args(hint)[0]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    if typing.get_origin(hint) is list:
        hint = typing.get_args(hint)[0]
    return hint


def _metavar(param: Any, value_type: Any) -> str:
    if param.metavar:
        return str(param.metavar)
    if isinstance(value_type, type) and issubclass(value_type, Enum):
        return "|".join(str(m.value) for m in value_type)
    return TYPE_WORDS.get(value_type, "VALUE")


def _default(param: Any) -> str:
    if param.required:
        return "required"
    value = param.default
    if getattr(param, "is_flag", False) and isinstance(value, bool):
        return "on" if value else "off"
    if value is None or value == [] or value == ():
        return "-"
    return f"`{value.value if isinstance(value, Enum) else value}`"


def _commands(app: typer.Typer) -> Iterator[tuple[str, Any]]:
    """``(path, click command)`` of every visible command, in registration order."""

    def walk(group: Any, prefix: str) -> Iterator[tuple[str, Any]]:
        for name, command in group.commands.items():
            if command.hidden:
                continue
            path = f"{prefix} {name}"
            if hasattr(command, "commands"):
                yield from walk(command, path)
            else:
                yield path, command

    yield from walk(typer.main.get_command(app), "cpkv")


def command_block(path: str, command: Any) -> str:
    """Usage, the help paragraph and a table of every argument and option of one command."""
    params = [p for p in command.params if p.name != "help"]
    callback = command.callback
    usage = [path, "[OPTIONS]"]
    rows = []
    for param in params:
        value_type = _value_type(callback, param.name)
        metavar = _metavar(param, value_type)
        if param.param_type_name == "argument":
            usage.append(metavar if param.required else f"[{metavar}]")
            name = metavar
        else:
            name = " ".join(filter(None, [", ".join(param.opts), metavar]))
            name += " ..." if getattr(param, "multiple", False) else ""
        rows.append(f"| `{_cell(name)}` | {_cell(_default(param))} | {_cell(param.help or '')} |")
    return "\n".join(
        [
            "```",
            " ".join(usage),
            "```",
            "",
            command.help or "",
            "",
            "| argument / option | default | help |",
            "| --- | --- | --- |",
            *rows,
            "",
        ]
    )


def cli_blocks(app: typer.Typer) -> dict[str, str]:
    """Block name (``cpkv verify``) to its text, for every visible command of ``app``."""
    return {path: command_block(path, command) for path, command in _commands(app)}


def _flag_default(name: str) -> str:
    value = FlagSet.model_fields[name].default
    if isinstance(value, bool):
        if FLAG_SPECS[name].env_only:
            return "on" if value else "off"
        return "`true`" if value else "`false`"
    if value is None:
        return "unset"
    return f"`{value.value if isinstance(value, Enum) else value}`"


def _choices(name: str) -> str:
    """`` Values: `a`, `b`.`` for an enum-typed flag, else nothing."""
    annotation = FlagSet.model_fields[name].annotation
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return " Values: " + ", ".join(f"`{m.value}`" for m in annotation) + "."
    return ""


def flag_blocks() -> dict[str, str]:
    """The server-flag table and the environment-only table, from :class:`FlagSet`'s docs."""
    server = ["| flag / TOML key | environment | default | help |", "| --- | --- | --- | --- |"]
    env_only = ["| variable | default | meaning |", "| --- | --- | --- |"]
    for name, spec in FLAG_SPECS.items():
        if spec.env_only:
            meaning = spec.help.removeprefix("Environment only: ")
            meaning = meaning[:1].upper() + meaning[1:]
            env_only.append(f"| `{spec.env}` | {_flag_default(name)} | {_cell(meaning)} |")
        else:
            help_text = spec.help + _choices(name)
            server.append(
                f"| `{spec.cli}` | `{spec.env}` | {_flag_default(name)} | {_cell(help_text)} |"
            )
    return {"flags": "\n".join([*server, ""]), "environment-only knobs": "\n".join([*env_only, ""])}


def fill_blocks(text: str, blocks: dict[str, str], page: str) -> str:
    """``text`` with every generated block replaced by ``blocks[name]``.

    Raises:
        StaleDocs: a block names nothing in ``blocks``, or a name in ``blocks`` has no block.
    """
    found = [m.group("name") for m in BLOCK.finditer(text)]
    unknown = [name for name in found if name not in blocks]
    missing = [name for name in blocks if name not in found]
    if unknown or missing:
        raise StaleDocs(
            f"docs/{page}: blocks for nothing in the code: {unknown or 'none'}; code with no "
            f"block: {missing or 'none'}. Add or remove the markers "
            "'<!-- BEGIN GENERATED NAME (cpkv docs) -->' ... '<!-- END GENERATED NAME -->', "
            "then run `cpkv docs`"
        )
    return BLOCK.sub(lambda m: m.group("begin") + blocks[m.group("name")] + m.group("end"), text)


def render_docs(app: typer.Typer, docs_dir: Path) -> dict[Path, str]:
    """The generated pages: path to the full text they should have."""
    pages = {CLI_PAGE: cli_blocks(app), FLAGS_PAGE: flag_blocks()}
    return {
        docs_dir / page: fill_blocks((docs_dir / page).read_text(), blocks, page)
        for page, blocks in pages.items()
    }


def stale_pages(app: typer.Typer, docs_dir: Path) -> list[Path]:
    """The generated pages whose text differs from what the code generates."""
    return [path for path, text in render_docs(app, docs_dir).items() if path.read_text() != text]


DEFAULT_DOCS_DIR = Path(__file__).resolve().parents[2] / "docs"
"""The repository's ``docs/`` (a source checkout)."""
DocsDirOpt = typing.Annotated[
    Path, typer.Option("--docs-dir", metavar="DIR", help="The docs folder to write.")
]


def register(app: typer.Typer) -> None:
    """Adds the hidden ``cpkv docs`` command that writes (or, with ``--check``, checks) the
    generated blocks of ``docs/cli.md`` and ``docs/flags.md``."""

    @app.command("docs", hidden=True)
    def docs_command(
        docs_dir: DocsDirOpt = DEFAULT_DOCS_DIR,
        check: typing.Annotated[
            bool, typer.Option("--check", help="Exit 1 when a page is stale; write nothing.")
        ] = False,
    ) -> None:
        """Regenerate the CLI and flag references in docs/ from the typer app and the flag
        model; with --check, exit 1 when they are stale."""
        try:
            pages = render_docs(app, docs_dir)
        except (StaleDocs, FileNotFoundError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from exc
        stale = [path for path, text in pages.items() if path.read_text() != text]
        for path in stale:
            if check:
                typer.echo(f"stale: {path} (run `cpkv docs`)", err=True)
            else:
                path.write_text(pages[path])
                typer.echo(f"wrote {path}", err=True)
        raise typer.Exit(1 if check and stale else 0)
