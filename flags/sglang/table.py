"""SGLang 0.5.23's command-line options, as data: :func:`sglang_options`.

The table (``flags/sglang/data/sglang-0.5.23.json``) is generated from the pinned wheel by
``scripts/sglang_flag_table.py``, which reads SGLang's argument declarations with ``ast``
(``sglang/srt/arg_groups/fields/*.py`` through the rules of ``arg_groups/arg_utils.py``, and
``ServerArgs.add_cli_args`` in ``sglang/srt/server_args.py``); ``tests/test_sglang_table.py``
fails when the file drifts from the wheel.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from pathlib import Path
from typing import Any

SGLANG_VERSION = "0.5.23"
"""The SGLang release whose launch commands cpkv reads."""
SGLANG = f"sglang {SGLANG_VERSION}"
"""How a rule's source is named: ``sglang 0.5.23``."""
TABLE_PATH = Path(__file__).parent / "data" / f"sglang-{SGLANG_VERSION}.json"
"""The generated option table."""


class OptionKind(StrEnum):
    """What an option does when given, as SGLang registers it with argparse."""

    STORE = "store"
    """Takes a value (``nargs`` values when set)."""
    STORE_TRUE = "store_true"
    """A switch: stores True."""
    BOOLEAN_OPTIONAL = "boolean_optional"
    """``--x`` stores True, ``--no-x`` False (``argparse.BooleanOptionalAction``)."""
    DEPRECATED_STORE_TRUE = "deprecated_store_true"
    """A retired switch that still stores True and warns, naming its replacement."""
    DEPRECATED_STORE_CONST = "deprecated_store_const"
    """A retired valued option that stores one constant on another field and warns."""
    LORA_PATHS = "LoRAPathAction"
    """``--lora-paths``: a list of paths or JSON objects."""
    HELP = "help"
    """``-h``/``--help``: SGLang prints its help and starts nothing."""


@dataclass(frozen=True, slots=True)
class SglangOption:
    """One argparse option of ``sglang serve``."""

    options: tuple[str, ...]
    """Its option strings: the name, then its aliases (``--tp-size``,
    ``--tensor-parallel-size``)."""
    dest: str
    """The ``ServerArgs`` field it sets (``tp_size``)."""
    kind: OptionKind
    type: str | None
    """Name of the value parser (``int``, ``float``, ``str``, ``human_readable_int``, ...)."""
    nargs: str | int | None
    choices: tuple[Any, ...] | None
    default: Any
    required: bool
    new_flag: str | None = None
    """What a deprecated option says to use instead."""
    const: Any = None
    """What a deprecated store-const option stores."""

    @property
    def name(self) -> str:
        """The option's own name: its first long option string."""
        return next(o for o in self.options if o.startswith("--"))


@cache
def sglang_options() -> tuple[SglangOption, ...]:
    """Every option ``sglang serve`` parses, in SGLang's registration order.

    Raises:
        RuntimeError: the table is missing or is not SGLang 0.5.23's (a broken install).
    """
    try:
        document = json.loads(TABLE_PATH.read_text())
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"cannot read SGLang's option table {TABLE_PATH}: {exc}") from exc
    if document.get("sglang") != SGLANG_VERSION:
        raise RuntimeError(f"{TABLE_PATH} is not SGLang {SGLANG_VERSION}'s option table")
    return tuple(_option(row) for row in document["options"])


def _option(row: dict[str, Any]) -> SglangOption:
    choices = row["choices"]
    return SglangOption(
        options=tuple(row["options"]),
        dest=row["dest"],
        kind=OptionKind(row["kind"]),
        type=row["type"],
        nargs=row["nargs"],
        choices=None if choices is None else tuple(choices),
        default=row["default"],
        required=row["required"],
        new_flag=row.get("new_flag"),
        const=row.get("const"),
    )


@cache
def option_by_dest() -> dict[str, SglangOption]:
    """Each ``ServerArgs`` field with a command-line option, to that option."""
    return {o.dest: o for o in sglang_options()}


def option_name(dest: str) -> str:
    """The option that sets field ``dest`` (``tp_size`` -> ``--tp-size``).

    Raises:
        KeyError: SGLang 0.5.23 has no option for ``dest``.
    """
    return option_by_dest()[dest].name
