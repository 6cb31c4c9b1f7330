"""The launcher of an SGLang command line, and the arguments it hands SGLang: :func:`split_launch`.

Operators start SGLang 0.5.23 in several spellings, all read here:

- ``[NAME=value ...] [env [NAME=value ...]] LAUNCHER ARGS``, where the assignments set the
  server's environment;
- ``python -m sglang.launch_server ARGS``, with any Python (``python``, ``python3``,
  ``python3.11``, a path to one such as ``/opt/venv/bin/python``) and any interpreter options
  before ``-m`` (``-u``, ``-O``, ``-X dev``, ``-W ignore``, combined as ``-uB``, ``-msglang...``
  included), as CPython reads them;
- ``sglang serve ARGS`` (or a path to the ``sglang`` script): SGLang's dispatcher
  (``sglang/cli/serve.py``) first removes ``--model-type X`` and reads a leading positional
  argument as ``--model-path``, and needs a model path spelled on the command line itself
  (``--model-path``, ``--model`` or their ``=`` forms; ``sglang/cli/utils.py:
  try_get_model_path``);
- ``ARGS`` alone, as ``python -m sglang.launch_server`` would receive them.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import PurePath

from flags.model import FlagError

LAUNCH_MODULE = "sglang.launch_server"
"""The module ``python -m`` runs to start the server."""

_ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")
_PYTHON_VALUED = frozenset("XWc")
"""CPython's short options that take a value (``-X opt``, ``-W arg``; ``-c`` is a program)."""
_PYTHON_SWITCHES = frozenset("bBdEhiIOPqsSuvVx")
"""CPython's short options without a value."""
_PYTHON_LONG_VALUED = frozenset({"--check-hash-based-pycs"})


@dataclass(frozen=True, slots=True)
class Launch:
    """A command line split the way the shell and SGLang's launcher split it."""

    env: dict[str, str]
    """The leading ``NAME=value`` assignments (the server's environment)."""
    argv: tuple[str, ...]
    """The arguments SGLang's ``prepare_server_args`` receives."""
    serve: bool
    """Started through ``sglang serve`` (its dispatcher's rules apply)."""
    launcher: str
    """How it was started: ``python -m sglang.launch_server``, ``sglang serve`` or ``args``."""


def split_launch(command: str) -> Launch:
    """The environment, SGLang's arguments and the launcher of ``command``.

    Raises:
        FlagError: the line does not split (an unclosed quote), runs another program or
            module, or is ``sglang serve`` without a model path on its command line.
    """
    try:
        tokens = shlex.split(command)
    except ValueError as exc:
        raise FlagError(f"cannot split the command line: {exc}") from exc
    env = _assignments(tokens)
    if tokens and tokens[0] == "env":
        tokens.pop(0)
        env.update(_assignments(tokens))
    if tokens and _PYTHON.match(PurePath(tokens[0]).name):
        return Launch(env, tuple(_python_module_args(tokens)), False, f"python -m {LAUNCH_MODULE}")
    if len(tokens) >= 2 and PurePath(tokens[0]).name == "sglang" and tokens[1] == "serve":
        return Launch(env, tuple(_serve_args(tokens[2:])), True, "sglang serve")
    if tokens and PurePath(tokens[0]).name == "sglang":
        program = " ".join(tokens[:2])
        raise FlagError(f"not an SGLang launch command: {program} (want sglang serve)")
    return Launch(env, tuple(tokens), False, "args")


def _assignments(tokens: list[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    while tokens and _ENV_ASSIGNMENT.match(tokens[0]):
        name, _, value = tokens.pop(0).partition("=")
        env[name] = value
    return env


def _python_module_args(tokens: list[str]) -> list[str]:
    """The arguments after ``-m sglang.launch_server``, CPython's options before it skipped.

    Raises:
        FlagError: the interpreter runs something else (a script, ``-c``, another module).
    """
    index = 1
    while index < len(tokens):
        token = tokens[index]
        if token in _PYTHON_LONG_VALUED:
            index += 2
            continue
        if not token.startswith("-") or token.startswith("--") or token == "-":
            raise FlagError(
                f"not an SGLang launch command: python runs {token!r}, want -m {LAUNCH_MODULE}"
            )
        module, index = _short_options(tokens, index)
        if module is None:
            continue
        if module != LAUNCH_MODULE:
            raise FlagError(f"not an SGLang launch command: -m {module} (want {LAUNCH_MODULE})")
        return tokens[index:]
    raise FlagError(f"not an SGLang launch command: python without -m {LAUNCH_MODULE}")


def _short_options(tokens: list[str], index: int) -> tuple[str | None, int]:
    """Reads one cluster of short options at ``tokens[index]`` (``-uB``, ``-X dev``,
    ``-msglang.launch_server``); returns the ``-m`` module if the cluster ends in one, and
    the index after what it consumed."""
    cluster = tokens[index][1:]
    for position, letter in enumerate(cluster):
        rest = cluster[position + 1 :]
        if letter == "m" or letter in _PYTHON_VALUED:
            value = rest if rest else (tokens[index + 1] if index + 1 < len(tokens) else "")
            after = index + 1 if rest else index + 2
            if letter == "m":
                return value, after
            if letter == "c":
                raise FlagError("not an SGLang launch command: python -c runs a program")
            return None, after
        if letter not in _PYTHON_SWITCHES:
            raise FlagError(f"not an SGLang launch command: unknown python option -{letter}")
    return None, index + 1


def _serve_args(argv: list[str]) -> list[str]:
    """``sglang serve``'s arguments as its dispatcher hands them to ``prepare_server_args``.

    Raises:
        FlagError: no model path on the command line (SGLang: "--model-path is required").
    """
    filtered: list[str] = []
    index = 0
    while index < len(argv):
        token = argv[index]
        if token == "--model-type":
            if index + 1 >= len(argv):
                raise FlagError("sglang serve: --model-type requires a value")
            index += 2
            continue
        if not token.startswith("--model-type="):
            filtered.append(token)
        index += 1
    if filtered and not filtered[0].startswith("-"):
        filtered = ["--model-path", *filtered]
    if _model_path_given(filtered) is None and not _help(filtered):
        raise FlagError(
            "sglang serve: error: --model-path is required: SGLang's dispatcher looks for "
            "--model-path or --model on the command line (a --config file's model_path is "
            "read too late); pass it there, or start with python -m sglang.launch_server"
        )
    return filtered


def _model_path_given(argv: list[str]) -> str | None:
    """``sglang/cli/utils.py: try_get_model_path``: exact spellings only, no prefixes."""
    for index, token in enumerate(argv):
        if token in ("--model-path", "--model") and index + 1 < len(argv):
            return argv[index + 1]
        if token.startswith(("--model-path=", "--model=")):
            return token.split("=", 1)[1]
    return None


def _help(argv: list[str]) -> bool:
    return any(token in ("-h", "--help") for token in argv)
