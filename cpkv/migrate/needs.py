"""What a step needs that its command lacks: :class:`Need`, :class:`Unmet`, and
:class:`FieldFix`, one entry of the table from a problem's value to the flags that fix it
(:mod:`cpkv.migrate.fixes`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cpkv.migrate.launch import Edit, EditKind
from flags import Problem, SglangImport
from flags.checks import Value

EditsOf = Callable[[SglangImport], tuple[Edit, ...]]
"""The edits that fix a value, given the command as read; empty: none applies here."""


@dataclass(frozen=True, slots=True)
class Need:
    """One flag a step needs that its command lacks, and the rule that wants it."""

    edit: Edit
    codes: tuple[str, ...]
    """The problem codes whose rules the edit satisfies (``SGLANG_KV_SHARDING_DSA_KERNELS``)."""
    field: str
    """The value the rule found wrong (``kv_cache_dtype``)."""
    found: Value
    rule: str
    """What the rule says (SGLang's text, or cpkv's hint)."""
    source: str
    """Where the rule lives: ``sglang 0.5.23 FILE``, or ``cpkv``."""
    deployment: str | None = None
    """How the fix changes the deployment beyond this server's flags; None: it does not."""
    resolved: bool = False
    """SGLang already resolves the field to the wanted value: the flag only says so."""

    def to_json(self) -> dict[str, Any]:
        """The stable JSON form (keys as in ``docs/migrate.md``)."""
        return {
            "flag": self.edit.text,
            "edit": {"kind": str(self.edit.kind), "name": self.edit.name, "value": self.edit.value},
            "codes": list(self.codes),
            "field": self.field,
            "found": self.found,
            "rule": self.rule,
            "source": self.source,
            "changes_deployment": self.deployment,
            "already_resolved": self.resolved,
        }


@dataclass(frozen=True, slots=True)
class Unmet:
    """A problem no flag of cpkv's table fixes: the step cannot run."""

    problem: Problem
    why: str

    def to_json(self) -> dict[str, Any]:
        """The problem's JSON and why it stays."""
        return self.problem.to_json() | {"why": self.why}


@dataclass(frozen=True, slots=True)
class FieldFix:
    """What one problem value should be, and the edits that make it so."""

    wanted: Callable[[Value, SglangImport], bool]
    """True when the value found already satisfies the rule."""
    edits: EditsOf | None
    """None: cpkv knows no flag that fixes it (:attr:`why` says so)."""
    deployment: str | None = None
    """How the fix changes the deployment; ``{found}`` is the value found."""
    why: str = ""
    """Why there is no fix, when :attr:`edits` is None or gives none."""
    target: str | None = None
    """The one value :attr:`edits` sets, as text, when it sets one field."""


def set_to(dest: str, value: str, deployment: str | None = None) -> FieldFix:
    """``--OPTION value``; satisfied when the value found is ``value``."""
    return FieldFix(
        lambda found, _: str(found) == value,
        lambda _: (Edit(EditKind.SET, dest, value),),
        deployment,
        target=value,
    )


def switch_on(dest: str, deployment: str | None = None) -> FieldFix:
    """``--SWITCH``; satisfied when the value found is true."""
    return FieldFix(
        lambda found, _: found is True, lambda _: (Edit(EditKind.SWITCH, dest),), deployment
    )


def always(edits: EditsOf, deployment: str | None = None, why: str = "") -> FieldFix:
    """Edits that answer the whole problem, whatever its values."""
    return FieldFix(lambda _, __: False, edits, deployment, why)


def unfixable(wanted: Callable[[Value], bool], why: str) -> FieldFix:
    """A value no flag fixes."""
    return FieldFix(lambda found, _: wanted(found), None, why=why)


def drop_given(*dests: str) -> EditsOf:
    """Drops each of ``dests`` the command gives."""
    return lambda imported: tuple(
        Edit(EditKind.DROP, d) for d in dests if d in imported.sglang.given
    )
