"""A command read, fixed and read again until no start-up problem is left: :func:`settle`.

Each round reads the command as ``cpkv flags --from-sglang`` does (``flags.read_sglang``,
then ``flags.check_flags``), answers every problem from the fix table
(:mod:`cpkv.migrate.fixes`) and applies the answers. It stops when the command is clean,
when a round changes nothing (what is left is unmet), or after :data:`MAX_ROUNDS`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from cpkv.migrate.fixes import FIELD_FIXES, fix
from cpkv.migrate.launch import Edit, EditKind, LaunchCommand
from cpkv.migrate.needs import Need, Unmet
from flags import FlagError, Problem, ProblemCode, SglangImport, check_flags, read_sglang
from flags.sglang.table import SGLANG

MAX_ROUNDS = 8
"""Rounds of read-and-fix before the problems left count as unmet (each fix round clears
at least one value; the longest chain seen is three)."""


@dataclass(frozen=True, slots=True)
class Settled:
    """A command after fixing, what it needed, and what no fix clears."""

    command: LaunchCommand
    imported: SglangImport
    """The command as the reader reads it."""
    needs: tuple[Need, ...]
    unmet: tuple[Unmet, ...]

    @property
    def runnable(self) -> bool:
        """True when neither SGLang's rules nor cpkv's refuse the command."""
        return not self.unmet


def check(command: LaunchCommand, preset: str | None) -> tuple[SglangImport, list[Problem]]:
    """The command as read, and every start-up problem: SGLang's, then cpkv's.

    Raises:
        RuntimeError: the reader refuses a command migrate built (indicates a bug).
    """
    try:
        imported = read_sglang(command.text, preset)
    except FlagError as exc:
        raise RuntimeError(
            f"migrate built {command.text!r}, which the reader refuses: {exc}"
        ) from exc
    return imported, [*imported.problems, *check_flags(imported.flags)]


def settle(command: LaunchCommand, preset: str | None) -> Settled:
    """``command`` with every problem the fix table answers fixed (see the module docstring)."""
    needs: list[Need] = []
    fired: set[ProblemCode] = set()
    for _ in range(MAX_ROUNDS):
        imported, problems = check(command, preset)
        if not problems:
            return _say_resolved(command, imported, fired, needs, preset)
        fired |= {p.code for p in problems}
        answers = [fix(p, imported) for p in problems]
        applied, after = _apply(command, _merged(n for found, _ in answers for n in found))
        if after == command:
            unmet = tuple(_unmet(p, *answer) for p, answer in zip(problems, answers, strict=True))
            return Settled(command, imported, tuple(needs), unmet)
        needs += applied
        command = after
    imported, problems = check(command, preset)
    why = f"still refused after {MAX_ROUNDS} rounds of fixes"
    return Settled(command, imported, tuple(needs), tuple(Unmet(p, why) for p in problems))


def _merged(needs: Iterable[Need]) -> list[Need]:
    """One need per edited name; the same edit asked by several rules keeps every code."""
    by_name: dict[str, Need] = {}
    for need in needs:
        first = by_name.get(need.edit.name)
        if first is None:
            by_name[need.edit.name] = need
        elif first.edit == need.edit and need.codes[0] not in first.codes:
            by_name[need.edit.name] = replace(first, codes=first.codes + need.codes)
    return list(by_name.values())


def _apply(command: LaunchCommand, needs: list[Need]) -> tuple[list[Need], LaunchCommand]:
    """The needs that change the command, and the command with them."""
    applied = []
    for need in needs:
        after = command.apply(need.edit)
        if after != command:
            applied.append(need)
            command = after
    return applied, command


def _unmet(problem: Problem, needs: list[Need], whys: list[str]) -> Unmet:
    if whys:
        return Unmet(problem, "; ".join(whys))
    if needs:
        tried = ", ".join(n.edit.text for n in needs)
        return Unmet(problem, f"{tried} does not clear it (is the value set by --config?)")
    return Unmet(problem, f"cpkv's fix table has no flag for {problem.code}: {problem.hint}")


def _say_resolved(
    command: LaunchCommand,
    imported: SglangImport,
    fired: set[ProblemCode],
    needs: list[Need],
    preset: str | None,
) -> Settled:
    """A value a fired rule checks that the command gives but SGLang resolves to what the
    rule wants (``--page-size 1``, which DSA resolves to 64) is written as resolved."""
    resolution = imported.sglang
    said: list[Need] = []
    for code in sorted(fired):
        for entry in FIELD_FIXES.get(code, {}).values():
            if entry.target is None or entry.edits is None:
                continue
            for edit in entry.edits(imported):
                dest = edit.name
                given = resolution.parsed_values.get(dest)
                if edit.kind is not EditKind.SET or dest not in resolution.given:
                    continue
                if str(given) != entry.target and str(resolution.values[dest]) == entry.target:
                    said.append(_resolved_need(edit, code, given, resolution.declared.get(dest)))
    applied, command = _apply(command, _merged(said))
    if not applied:
        return Settled(command, imported, tuple(needs), ())
    imported, problems = check(command, preset)
    assert not problems, f"writing resolved values broke {command.text!r}: {problems}"
    return Settled(command, imported, (*needs, *applied), ())


def _resolved_need(edit: Edit, code: ProblemCode, given: object, file: str | None) -> Need:
    where = f"{SGLANG} {file}" if file else SGLANG
    found = given if isinstance(given, str | int | bool) or given is None else str(given)
    rule = f"SGLang resolves {edit.name} to {edit.value} already ({where}); the command says so"
    return Need(edit, (str(code),), edit.name, found, rule, where, None, resolved=True)
