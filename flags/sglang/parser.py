"""SGLang 0.5.23's argument parsing of a launch command: :func:`parse_sglang_argv`.

The parser is Python's own ``argparse``, built from SGLang's option table
(:mod:`flags.sglang.table`) the way ``ServerArgs.add_cli_args`` builds it
(``sglang/srt/server_args.py``), so unique prefixes (``--cp-strat``), aliases
(``--attention-context-parallel-size``), ``=`` forms, ``nargs``, choices and the required
``--model-path`` behave as they do in ``sglang serve``. What SGLang's argparse refuses (it
exits 2) raises :class:`SglangArgError`, naming the closest real option.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from functools import cache
from typing import Any, NoReturn

from flags.model import FlagError
from flags.sglang.table import OptionKind, SglangOption, sglang_options

PROG = "sglang serve"
"""The program name SGLang's parser reports errors under."""
_GIVEN = "_cpkv_given"
_WARNINGS = "_cpkv_warnings"
_CALLS = "_cpkv_calls"


class SglangArgError(FlagError):
    """A launch command SGLang 0.5.23's argument parser refuses (``sglang serve`` exits 2)."""


@dataclass(frozen=True, slots=True)
class ParsedArgs:
    """What SGLang's parser makes of a command's arguments."""

    values: dict[str, Any]
    """Every ``ServerArgs`` field with an option, to its value (the default when not given)."""
    given: dict[str, str]
    """Each field the command sets, to the option string that set it (a prefix is expanded:
    ``--tp 8`` sets ``tp_size`` through ``--tp-size``)."""
    warnings: tuple[str, ...]
    """What SGLang's parser warns about (a deprecated option, naming its replacement)."""
    from_config: frozenset[str] = frozenset()
    """The fields a ``--config`` file set and the command line did not set again."""


def parse_sglang_argv(argv: Sequence[str], config_options: int = 0) -> ParsedArgs:
    """Parses ``argv`` (the arguments after ``sglang serve``) as SGLang 0.5.23 does.

    Args:
        argv: the arguments, a ``--config`` file's options merged in first
            (:func:`flags.sglang.yaml_config.merge_config`).
        config_options: how many options at the head of ``argv`` came from the file.

    Raises:
        SglangArgError: an unknown, ambiguous or malformed option, a bad value or choice, or
            no ``--model-path``; the message names the closest real option.
    """
    namespace = argparse.Namespace(**{_GIVEN: {}, _WARNINGS: [], _CALLS: []})
    _parser().parse_args(list(argv), namespace)
    given: dict[str, str] = getattr(namespace, _GIVEN)
    warnings: list[str] = getattr(namespace, _WARNINGS)
    calls: list[str] = getattr(namespace, _CALLS)
    # NOTE: argparse runs one action per option, in order, so the first ``config_options``
    # calls are the file's; a field the command line sets again is the command line's.
    from_config = set(calls[:config_options]) - set(calls[config_options:])
    internal = (_GIVEN, _WARNINGS, _CALLS)
    values = {k: v for k, v in vars(namespace).items() if k not in internal}
    return ParsedArgs(values, dict(given), tuple(warnings), frozenset(from_config))


@cache
def _defaults() -> tuple[tuple[str, Any], ...]:
    return tuple(parse_sglang_argv(["--model-path", "-"]).values.items())


def sglang_defaults() -> dict[str, Any]:
    """Every ``ServerArgs`` field with an option, at SGLang's default (``model_path`` "-")."""
    return dict(_defaults())


class _Parser(argparse.ArgumentParser):
    """argparse that raises :class:`SglangArgError` where SGLang's prints usage and exits 2."""

    def error(self, message: str) -> NoReturn:
        hint = suggestion(message)
        raise SglangArgError(f"{self.prog}: error: {message}{'; ' + hint if hint else ''}")


@cache
def _parser() -> _Parser:
    parser = _Parser(prog=PROG, add_help=False)
    for option in sglang_options():
        parser.add_argument(*option.options, **_arguments(option))
    return parser


def _arguments(option: SglangOption) -> dict[str, Any]:
    common: dict[str, Any] = {"dest": option.dest, "default": option.default}
    kind = option.kind
    if kind is OptionKind.STORE or kind is OptionKind.LORA_PATHS:
        value: dict[str, Any] = {"type": VALUE_TYPES[option.type or "str"]}
        if option.nargs is not None:
            value["nargs"] = option.nargs
        if option.choices is not None:
            value["choices"] = list(option.choices)
        return common | value | {"action": _Store, "required": option.required}
    if kind is OptionKind.STORE_TRUE:
        return common | {"action": _StoreConst, "const": True}
    if kind is OptionKind.BOOLEAN_OPTIONAL:
        return common | {"action": _BooleanOptional}
    if kind is OptionKind.DEPRECATED_STORE_TRUE:
        return common | {"action": _Deprecated, "const": True, "new_flag": option.new_flag}
    if kind is OptionKind.DEPRECATED_STORE_CONST:
        choices = {"choices": list(option.choices)} if option.choices else {}
        return (
            common
            | choices
            | {
                "action": _Deprecated,
                "const": option.const,
                "new_flag": option.new_flag,
                "nargs": None,
            }
        )
    return {"action": _Help}


class _Store(argparse.Action):
    """Stores the value(s) and notes which option set the field."""

    def __call__(
        self, parser: Any, namespace: Any, values: Any, option_string: str | None = None
    ) -> None:
        setattr(namespace, self.dest, values)
        getattr(namespace, _GIVEN)[self.dest] = option_string
        getattr(namespace, _CALLS).append(self.dest)


class _StoreConst(_Store):
    """A switch (``store_true``): stores its constant."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(
        self, parser: Any, namespace: Any, values: Any, option_string: str | None = None
    ) -> None:
        super().__call__(parser, namespace, self.const, option_string)


class _BooleanOptional(_Store):
    """``--x`` stores True and ``--no-x`` False; the table lists both option strings."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(
        self, parser: Any, namespace: Any, values: Any, option_string: str | None = None
    ) -> None:
        on = not (option_string or "").startswith("--no-")
        super().__call__(parser, namespace, on, option_string)


class _Deprecated(_Store):
    """A retired option that still works (``--enable-dp-attention``): stores its constant
    and warns as SGLang does (``arg_groups/argparse_actions.py``), naming the replacement."""

    def __init__(
        self, option_strings: list[str], dest: str, new_flag: str | None = None, **kwargs: Any
    ) -> None:
        self.new_flag = new_flag
        kwargs.setdefault("nargs", 0)
        if kwargs["nargs"] is None:
            del kwargs["nargs"]
        super().__init__(option_strings, dest, **kwargs)

    def __call__(
        self, parser: Any, namespace: Any, values: Any, option_string: str | None = None
    ) -> None:
        super().__call__(parser, namespace, self.const, option_string)
        use = f" Use '{self.new_flag}' instead." if self.new_flag else ""
        warning = f"'{option_string}' is deprecated and will be removed in a future release.{use}"
        getattr(namespace, _WARNINGS).append(warning)


class _Help(argparse.Action):
    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0)

    def __call__(
        self, parser: Any, namespace: Any, values: Any, option_string: str | None = None
    ) -> None:
        parser.error(
            f"{option_string}: SGLang prints its help and starts nothing; give a launch command"
        )


def suggestion(message: str) -> str:
    """``did you mean --x?`` for an argparse error about an unknown or ambiguous option."""
    ambiguous = re.match(r"ambiguous option: (\S+?)(?:=\S*)? could match (.*)$", message)
    if ambiguous:
        given, candidates = ambiguous.group(1), ambiguous.group(2).split(", ")
        ranked = difflib.get_close_matches(given, candidates, n=len(candidates), cutoff=0.0)
        return "did you mean " + " or ".join(ranked) + "?"
    unknown = re.match(r"unrecognized arguments: (.*)$", message)
    if not unknown:
        return ""
    names = [o for option in sglang_options() for o in option.options if o.startswith("--")]
    hints = []
    for token in unknown.group(1).split():
        if token.startswith("--"):
            close = difflib.get_close_matches(token.partition("=")[0], names, n=1, cutoff=0.6)
            hints += [f"{token.partition('=')[0]}: did you mean {close[0]}?"] if close else []
    return "; ".join(hints)


def _json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid JSON: {text}") from None


def _nullable_str(text: str) -> str | None:
    return None if not text or text == "None" else text


_SI = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_IEC = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def _human_readable_int(text: str) -> int:
    """An int, or one with an SI (``25.6k``) or IEC (``1Mi``, integers only) suffix."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", text.strip())
    if not match:
        return int(text)
    number, suffix = match.groups()
    if suffix in _IEC and "." in number:
        raise argparse.ArgumentTypeError(f"decimals are not allowed with IEC suffix {suffix!r}")
    value = Decimal(number) * (_SI[suffix] if suffix in _SI else _IEC[suffix])
    if value != value.to_integral_value():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
    return int(value)


def _cuda_graph_backend(text: str) -> str:
    if text == "tc_piecewise":
        raise argparse.ArgumentTypeError(
            "tc_piecewise was removed; select breakable, full, or disabled"
        )
    return text


def _cuda_graph_config(text: str) -> Any:
    value = _json_value(text)
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("--cuda-graph-config must be a JSON object")
    return value


def _named(name: str, parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """``parse`` under SGLang's parser name, which argparse shows in ``invalid X value``."""
    parse.__name__ = name
    return parse


VALUE_TYPES: dict[str, Callable[[str], Any]] = {
    "int": int,
    "float": float,
    "str": str,
    "loads": _named("loads", _json_value),
    "json_list_type": _named("json_list_type", _json_value),
    "nullable_str": _named("nullable_str", _nullable_str),
    "human_readable_int": _named("human_readable_int", _human_readable_int),
    "parse_cuda_graph_backend_arg": _named("parse_cuda_graph_backend_arg", _cuda_graph_backend),
    "parse_cuda_graph_config_arg": _named("parse_cuda_graph_config_arg", _cuda_graph_config),
}
"""Each value parser of the table, by name. ``--cuda-graph-config`` is checked only as a JSON
object (SGLang also checks its phases and keys)."""
