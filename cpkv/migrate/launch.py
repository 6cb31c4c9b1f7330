"""A launch command as editable data: :class:`LaunchCommand`, :class:`Edit`, :func:`changes`.

A command is its leading ``NAME=value`` assignments and its arguments, grouped by the
``ServerArgs`` field each option sets, with the command's own tokens kept (``--tp 8`` stays
``--tp 8``). Edits are by field: set an option's value, turn a switch on, drop an option, set
or unset a variable. It is printed as ``[NAME=value ...] sglang serve ARGS``, which
``flags.read_sglang`` reads back as it read the original.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from functools import cache

from flags.sglang.parser import parse_sglang_argv
from flags.sglang.table import OptionKind, SglangOption, option_name, sglang_options

PROGRAM = ("sglang", "serve")
"""How every migrated command starts SGLang 0.5.23."""
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


@dataclass(frozen=True, slots=True)
class ArgGroup:
    """One option of a command with the values it took, as the command spelled them."""

    dest: str
    """The ``ServerArgs`` field the option sets (``tp_size``)."""
    tokens: tuple[str, ...]
    """The option and its values (``("--tp", "8")``, ``("--page-size=64",)``)."""

    @property
    def text(self) -> str:
        """The tokens as a shell would read them back."""
        return shlex.join(self.tokens)


class EditKind(StrEnum):
    """What an :class:`Edit` does."""

    SET = "set"
    """Give an option a value (``--kv-cache-dtype fp8_e4m3``)."""
    SWITCH = "switch"
    """Turn a switch on (``--enable-kv-cache-sharding``)."""
    DROP = "drop"
    """Remove an option."""
    ENV = "env"
    """Set a leading variable (``CPKV_SHADOW_RATE=0.01``)."""
    UNSET_ENV = "unset-env"
    """Remove a leading variable."""


@dataclass(frozen=True, slots=True)
class Edit:
    """One change to a command, by field (or variable) name."""

    kind: EditKind
    name: str
    """The ``ServerArgs`` field (SET, SWITCH, DROP) or the variable (ENV, UNSET_ENV)."""
    value: str | None = None
    """The option's or variable's new value (SET, ENV)."""

    @property
    def text(self) -> str:
        """As an operator reads it: ``--page-size 64``, ``drop --x``, ``NAME=1``."""
        if self.kind is EditKind.SET:
            return f"{option_name(self.name)} {self.value}"
        if self.kind is EditKind.SWITCH:
            return option_name(self.name)
        if self.kind is EditKind.DROP:
            return f"drop {option_name(self.name)}"
        if self.kind is EditKind.ENV:
            return f"{self.name}={self.value}"
        return f"unset {self.name}"


@dataclass(frozen=True, slots=True)
class LaunchCommand:
    """``[NAME=value ...] sglang serve ARGS``, by option.

    Invariant: the groups' fields are the fields SGLang's parser says the arguments set
    (those of a ``--config`` file aside).
    """

    env: tuple[tuple[str, str], ...]
    """Leading assignments, in order."""
    groups: tuple[ArgGroup, ...]
    """The options, in the command's order."""

    @classmethod
    def from_parts(cls, env: dict[str, str], argv: Sequence[str]) -> LaunchCommand:
        """The command of ``env`` and ``argv`` (the arguments after ``sglang serve``, which
        SGLang 0.5.23's parser accepts).

        Raises:
            RuntimeError: the grouping disagrees with SGLang's parser (indicates a bug).
        """
        groups = group_arguments(argv)
        given = set(parse_sglang_argv(argv).given)
        found = {g.dest for g in groups}
        # NOTE: a --config file may give fields the arguments do not.
        if not found <= given or (found != given and "config" not in found):
            raise RuntimeError(f"grouped fields {sorted(found)} != parsed {sorted(given)}: a bug")
        return cls(tuple(env.items()), tuple(groups))

    @property
    def argv(self) -> tuple[str, ...]:
        """The arguments after ``sglang serve``."""
        return tuple(token for group in self.groups for token in group.tokens)

    @property
    def env_dict(self) -> dict[str, str]:
        """The assignments as a mapping."""
        return dict(self.env)

    @property
    def text(self) -> str:
        """The command line: assignments, ``sglang serve``, the arguments."""
        env = [f"{name}={shlex.quote(value)}" for name, value in self.env]
        return " ".join([*env, *PROGRAM, *(shlex.quote(t) for t in self.argv)])

    def group(self, dest: str) -> ArgGroup | None:
        """The option that sets ``dest`` (the last one, as argparse keeps), or None."""
        found = [g for g in self.groups if g.dest == dest]
        return found[-1] if found else None

    def apply(self, edit: Edit) -> LaunchCommand:
        """This command with ``edit`` made."""
        if edit.kind is EditKind.ENV:
            assert edit.value is not None, f"{edit} has no value"
            env = dict(self.env) | {edit.name: edit.value}
            return replace(self, env=tuple(env.items()))
        if edit.kind is EditKind.UNSET_ENV:
            return replace(self, env=tuple((n, v) for n, v in self.env if n != edit.name))
        if edit.kind is EditKind.DROP:
            return replace(self, groups=tuple(g for g in self.groups if g.dest != edit.name))
        name = option_name(edit.name)
        tokens = (name,) if edit.kind is EditKind.SWITCH else (name, str(edit.value))
        return self._put(ArgGroup(edit.name, tokens))

    def _put(self, new: ArgGroup) -> LaunchCommand:
        """Replaces the option of ``new.dest`` where the command first gave it, else appends."""
        if self.group(new.dest) is None:
            return replace(self, groups=(*self.groups, new))
        groups: list[ArgGroup] = []
        for group in self.groups:
            if group.dest != new.dest:
                groups.append(group)
            elif new not in groups:
                groups.append(new)
        return replace(self, groups=tuple(groups))


@dataclass(frozen=True, slots=True)
class Changes:
    """What one command adds, removes and changes against another, as command text."""

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    changed: tuple[tuple[str, str], ...] = ()
    """(before, after) pairs."""

    @property
    def empty(self) -> bool:
        """True when the two commands say the same."""
        return not (self.added or self.removed or self.changed)

    def to_json(self) -> dict[str, object]:
        """``{"added": [...], "removed": [...], "changed": [{"from", "to"}]}``."""
        return {
            "added": list(self.added),
            "removed": list(self.removed),
            "changed": [{"from": a, "to": b} for a, b in self.changed],
        }


def changes(before: LaunchCommand, after: LaunchCommand) -> Changes:
    """``after`` against ``before``: options by field, then variables by name."""
    old = {g.dest: g.text for g in before.groups}
    new = {g.dest: g.text for g in after.groups}
    old |= {f"${n}": f"{n}={shlex.quote(v)}" for n, v in before.env}
    new |= {f"${n}": f"{n}={shlex.quote(v)}" for n, v in after.env}
    added = tuple(text for key, text in new.items() if key not in old)
    removed = tuple(text for key, text in old.items() if key not in new)
    changed = tuple((old[k], text) for k, text in new.items() if k in old and old[k] != text)
    return Changes(added, removed, changed)


def group_arguments(argv: Sequence[str]) -> list[ArgGroup]:
    """``argv`` cut into options, each with the values argparse gives it.

    A prefix (``--cp-strat``) is read as the one option it starts; ``--x=v`` takes no more
    tokens; ``nargs`` ``+``/``*`` take tokens up to the next option (a negative number is a
    value, as in argparse).

    Raises:
        RuntimeError: a token that names no option of SGLang 0.5.23, or several (the command
            was not one SGLang's parser accepts: indicates a bug).
    """
    groups: list[ArgGroup] = []
    i = 0
    while i < len(argv):
        name, eq, _ = argv[i].partition("=")
        option = _resolve(name)
        count = 0 if eq else _values_taken(option, argv[i + 1 :])
        groups.append(ArgGroup(option.dest, tuple(argv[i : i + 1 + count])))
        i += 1 + count
    return groups


def _values_taken(option: SglangOption, rest: Sequence[str]) -> int:
    if option.kind in (OptionKind.STORE_TRUE, OptionKind.BOOLEAN_OPTIONAL, OptionKind.HELP):
        return 0
    if option.kind is OptionKind.DEPRECATED_STORE_TRUE:
        return 0
    nargs = option.nargs
    if isinstance(nargs, int):
        return nargs
    values = 0
    while values < len(rest) and not _option_like(rest[values]):
        values += 1
    if nargs in ("+", "*"):
        return values
    return min(values, 1)


def _option_like(token: str) -> bool:
    return token.startswith("-") and len(token) > 1 and not _NEGATIVE_NUMBER.match(token)


def _resolve(name: str) -> SglangOption:
    strings = _option_strings()
    if name in strings:
        return strings[name]
    matches = {strings[s].dest: strings[s] for s in strings if s.startswith(name)}
    if len(matches) != 1 or not name.startswith("--"):
        raise RuntimeError(f"{name!r} names {len(matches)} SGLang options: indicates a bug")
    return next(iter(matches.values()))


@cache
def _option_strings() -> dict[str, SglangOption]:
    return {string: option for option in sglang_options() for string in option.options}
