"""Command help that reads well: each command's docstring as one paragraph, no hard breaks.

Docstrings are wrapped at 100 columns in the source; help shown in a terminal must not keep
those breaks ("compare each with the / non-CP reference"). :func:`tidy_help` rewrites the help
of every command registered on an app (sub-apps included) once, at import.
"""

from __future__ import annotations

import inspect

import typer

MAX_HELP_CHARS = 320
"""A command's help is one short paragraph: at most this many characters."""


def one_paragraph(text: str) -> str:
    """Every line and paragraph of ``text`` joined by single spaces."""
    return " ".join(text.split())


def first_sentence(text: str) -> str:
    """Up to and including the first ``. `` (the whole text when there is none)."""
    head, sep, _ = text.partition(". ")
    return head + "." if sep else text


def tidy_help(app: typer.Typer) -> None:
    """Sets every command's help to its docstring (or ``help=``) as one paragraph, and the
    line in its app's command list to the first sentence; recurses into sub-apps."""
    for command in app.registered_commands:
        text = command.help
        if text is None and command.callback is not None:
            text = inspect.getdoc(command.callback)
        command.help = one_paragraph(text or "")
        command.short_help = first_sentence(command.help)
    if isinstance(app.info.help, str):
        app.info.help = one_paragraph(app.info.help)
        app.info.short_help = first_sentence(app.info.help)
    for group in app.registered_groups:
        # NOTE: unset TyperInfo fields hold typer's DefaultPlaceholder, not None.
        if isinstance(group.help, str):
            group.help = one_paragraph(group.help)
            group.short_help = first_sentence(group.help)
        if isinstance(group.typer_instance, typer.Typer):
            tidy_help(group.typer_instance)
