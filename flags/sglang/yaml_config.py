"""``--config FILE.yaml`` as SGLang 0.5.23 merges it with the command line: :func:`merge_config`.

``prepare_server_args`` (``sglang/srt/server_args.py``) calls ``ConfigArgumentMerger``
(``sglang/srt/utils/server_args_config_parser.py``) when the arguments hold the exact token
``--config``. The merger turns the YAML mapping into options and puts them **before** the
command line's own, so argparse lets the command line win: command line > YAML > defaults.
Each key becomes ``--KEY`` as spelled (``tp-size`` and the prefix ``tp`` work, ``tp_size``
does not: argparse knows no such option):

- ``true`` for a switch (``store_true``) adds ``--KEY``, ``false`` adds nothing; any other
  boolean is ``--KEY true|false``;
- a list is ``--KEY a b ...`` (an empty list adds nothing), a mapping is ``--KEY JSON``;
- anything else is ``--KEY str(value)``.

A key of an option that takes no value and is not a plain switch (``--no-x`` pairs, the
deprecated switches such as ``enable_dp_attention``, ``--lora-paths``) is refused. One
``--config`` at most, followed by a path with the suffix ``.yaml`` or ``.yml`` of a file that
exists and holds a mapping (or nothing). ``--config=FILE`` is not the token ``--config``: the
merger does not run, and argparse stores the path and reads nothing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from flags.model import FlagError
from flags.sglang.table import OptionKind, SglangOption, sglang_options

CONFIG_OPTION = "--config"
_SUFFIXES = (".yaml", ".yml")
_VALUED = frozenset({OptionKind.STORE, OptionKind.DEPRECATED_STORE_CONST})
"""Option kinds the merger passes a value to (argparse store actions and ``nargs=None``)."""


class SglangConfigError(FlagError):
    """A ``--config`` file SGLang 0.5.23 refuses to merge (it raises ``ValueError``)."""


@dataclass(frozen=True, slots=True)
class MergedArgs:
    """A command line with its YAML config merged in, as SGLang hands it to argparse."""

    argv: tuple[str, ...]
    """The YAML's options, then the command line's without ``--config FILE``."""
    config: str | None
    """The config file's path as the command gives it; None without ``--config``."""
    config_options: int
    """How many options at the head of :attr:`argv` came from the config file."""


def merge_config(argv: Sequence[str]) -> MergedArgs:
    """Merges the ``--config`` file of ``argv`` as SGLang 0.5.23 does (module docstring).

    Raises:
        SglangConfigError: two ``--config``, none followed by a path, a path that is not
            ``.yaml``/``.yml`` or does not exist, YAML that does not parse or is not a
            mapping, or a key SGLang does not merge.
    """
    argv = list(argv)
    if CONFIG_OPTION not in argv:
        return MergedArgs(tuple(argv), None, 0)
    indices = [i for i, token in enumerate(argv) if token == CONFIG_OPTION]
    if len(indices) > 1:
        raise SglangConfigError("--config: multiple config files specified; only one allowed")
    index = indices[0]
    if index == len(argv) - 1:
        raise SglangConfigError("--config: no config file specified after --config")
    path = argv[index + 1]
    options = config_to_args(_read_mapping(path))
    merged = options + argv[:index] + argv[index + 2 :]
    return MergedArgs(tuple(merged), path, sum(token.startswith("--") for token in options))


def _read_mapping(path: str) -> dict[Any, Any]:
    file = Path(path)
    if file.suffix.lower() not in _SUFFIXES:
        raise SglangConfigError(f"--config {path}: must be a YAML file (.yaml or .yml)")
    if not file.exists():
        raise SglangConfigError(f"--config {path}: config file not found")
    try:
        document = yaml.safe_load(file.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise SglangConfigError(f"--config {path}: cannot read it as YAML: {exc}") from exc
    if document is None:
        return {}
    if not isinstance(document, dict):
        found = type(document).__name__
        raise SglangConfigError(
            f"--config {path}: must hold a mapping of option to value at its root, got {found}"
        )
    return document


def config_to_args(config: dict[Any, Any]) -> list[str]:
    """The options a config mapping becomes, in its key order.

    Raises:
        SglangConfigError: a key of an option the merger does not support.
    """
    switches, unsupported = _key_kinds()
    args: list[str] = []
    for key, value in config.items():
        key = str(key)
        normalized = key.replace("-", "_")
        if normalized in unsupported:
            raise SglangConfigError(
                f"--config: unsupported config option {normalized!r} ({unsupported[normalized]}"
                " takes no value); set it on the command line instead"
            )
        if isinstance(value, bool):
            if normalized in switches:
                args += [f"--{key}"] if value else []
            else:
                args += [f"--{key}", str(value).lower()]
        elif isinstance(value, list):
            args += [f"--{key}", *(str(item) for item in value)] if value else []
        elif isinstance(value, dict):
            args += [f"--{key}", json.dumps(value)]
        else:
            args += [f"--{key}", str(value)]
    return args


@cache
def _key_kinds() -> tuple[frozenset[str], dict[str, str]]:
    """The keys of switches, and each unsupported key to its option (``_config_keys``)."""
    switches: set[str] = set()
    supported: set[str] = set()
    unsupported: dict[str, str] = {}
    for option in sglang_options():
        if option.kind is OptionKind.HELP or CONFIG_OPTION in option.options:
            continue
        keys = _config_keys(option)
        if option.kind is OptionKind.STORE_TRUE:
            switches |= keys
            supported |= keys
        elif option.kind in _VALUED:
            supported |= keys
        else:
            unsupported |= dict.fromkeys(keys, option.name)
    return frozenset(switches), {k: v for k, v in unsupported.items() if k not in supported}


def _config_keys(option: SglangOption) -> set[str]:
    """The YAML keys that name ``option``: its field and each long spelling, ``-`` as ``_``."""
    longs = {o[2:].replace("-", "_") for o in option.options if o.startswith("--")}
    return {option.dest} | longs
