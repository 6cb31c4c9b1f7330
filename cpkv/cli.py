"""The ``cpkv`` command line (typer): the app, its commands (one module each in
:mod:`cpkv.commands`) and :func:`main`. Exit codes: 0 ok, 1 failed check, 2 bad input."""

from __future__ import annotations

import typer

from cpkv.commands import bench, demo, docs, explain, fuzz, migrate, pd, plan, trace, verify
from cpkv.commands import flags as flag_commands
from cpkv.commands import phases as phase_command
from cpkv.common.help_text import tidy_help

app = typer.Typer(
    name="cpkv",
    help="Shard the KV cache of context-parallel prefill, phase by phase.",
    no_args_is_help=True,
    add_completion=False,
    # NOTE: click's plain help: option names are never cut at 80 columns and flags show no
    # value type (rich's panels cut long names with "…" and show "--help <bool>").
    rich_markup_mode=None,
)

COMMANDS = (
    verify,
    explain,
    phase_command,
    bench,
    demo,
    pd,
    fuzz,
    flag_commands,
    plan,
    migrate,
    trace,
    docs,
)
"""Every command module, in the order ``cpkv --help`` lists them."""

for command in COMMANDS:
    command.register(app)
tidy_help(app)  # NOTE: last, so that it sees every command registered above


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
