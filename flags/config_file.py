"""The persisted config file that ``cpkv enable`` / ``cpkv disable`` edit, atomically.

A change is refused when it would add a start-up problem (a need left off, a dependent
left on, a combination or phase contract that fails); problems already there are not
the change's fault and do not block it. A refused change leaves the file untouched.
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from flags.checks import ProblemCode, check_flags
from flags.model import FLAG_SPECS, PHASE_FIELDS, FlagError, FlagSet
from flags.sources import Layer, file_layer, merge_layers, parse_config_text, read_env
from phases import PhaseId, closure_of_needs

NEW_FILE_HEADER = (
    "# cpkv flags: flat `key = value` lines, each key a CLI flag without `--` (docs/flags.md).\n"
)

Action = Literal["enable", "disable"]


@dataclass(frozen=True, slots=True)
class ConfigChange:
    """What enabling or disabling a phase does to the config file, and whether it may."""

    action: Action
    phase: PhaseId
    path: Path
    writes: dict[str, bool]
    """Config-file key to its new value; empty when the file already says so."""
    reasons: tuple[str, ...]
    """Start-up problems the change would add; non-empty means refused."""
    hint: str
    """How to make a refused change go through."""
    notes: tuple[str, ...]
    """Things that keep the change from taking effect (environment, ceiling)."""
    old_text: str | None
    """The file before; None when it did not exist."""
    new_text: str
    enabled_after: frozenset[PhaseId]
    """Phases the gate is handed once the change is in (as is, when refused)."""
    applied: bool = False
    """True once the new text was written."""

    @property
    def refused(self) -> bool:
        """True when the change would add a start-up problem."""
        return bool(self.reasons)

    def to_json(self) -> dict[str, Any]:
        """One JSON document for ``--json``."""
        return {
            "action": self.action,
            "phase": int(self.phase),
            "path": str(self.path),
            "refused": self.refused,
            "applied": self.applied,
            "writes": self.writes,
            "reasons": list(self.reasons),
            "hint": self.hint,
            "notes": list(self.notes),
            "enabled_phases": sorted(int(p) for p in self.enabled_after),
        }


def enable(path: Path, phase: PhaseId, with_needs: bool = False) -> ConfigChange:
    """Turns ``phase`` on in the config file (created if missing), unless refused."""
    return apply_change(plan_change(path, "enable", phase, with_needs))


def disable(path: Path, phase: PhaseId, cascade: bool = False) -> ConfigChange:
    """Turns ``phase`` off in the config file, unless refused."""
    return apply_change(plan_change(path, "disable", phase, cascade))


def apply_change(change: ConfigChange) -> ConfigChange:
    """Writes an allowed change atomically; returns it with ``applied`` set."""
    if change.refused or not change.writes:
        return change
    write_atomic(change.path, change.new_text)
    return ConfigChange(**{**_fields(change), "applied": True})


def _fields(change: ConfigChange) -> dict[str, Any]:
    return {name: getattr(change, name) for name in ConfigChange.__dataclass_fields__}


def plan_change(path: Path, action: Action, phase: PhaseId, extend: bool) -> ConfigChange:
    """Computes a change without writing; ``extend`` is ``--with-needs`` or ``--cascade``.

    Raises:
        FlagError: the file (or an environment variable) is malformed, or a missing file
            is to be created in a directory that does not exist.
    """
    old_text = _read_text(path)
    old_values = parse_config_text(old_text or "", path)
    env = read_env()
    before, _ = merge_layers(file_layer(old_values, path), env)
    on = action == "enable"
    targets = _targets(before, phase, on, extend)
    writes = {
        _key(p): on
        for p in sorted(targets)
        if bool(old_values.get(PHASE_FIELDS[p], False)) is not on
    }
    new_text = edit_text(old_text, writes) if writes else (old_text or "")
    new_values = parse_config_text(new_text, path)
    after, _ = merge_layers(file_layer(new_values, path), env)
    if any(new_values.get(PHASE_FIELDS[p], False) is not on for p in targets):
        raise RuntimeError(f"edited {path} does not set {sorted(targets)} to {on}; a bug")
    seen = {str(p) for p in check_flags(before)}
    added = [p for p in check_flags(after) if str(p) not in seen]
    hint = _hint(action, phase, [p.code for p in added], extend)
    return ConfigChange(
        action=action,
        phase=phase,
        path=path,
        writes=writes,
        reasons=tuple(str(p) for p in added),
        hint=hint if added else "",
        notes=_notes(after, targets, on, env),
        old_text=old_text,
        new_text=new_text,
        enabled_after=(before if added else after).enabled_phases(),
    )


def _read_text(path: Path) -> str | None:
    if not path.exists():
        if not path.parent.is_dir():
            raise FlagError(f"cannot create {path}: directory {path.parent} does not exist")
        return None
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise FlagError(f"config file {path} cannot be read: {exc}") from exc


def _key(phase: PhaseId) -> str:
    key = FLAG_SPECS[PHASE_FIELDS[phase]].toml_key
    assert key is not None, f"phase flag {phase} has no config key"
    return key


def _targets(flags: FlagSet, phase: PhaseId, on: bool, extend: bool) -> set[PhaseId]:
    targets = {phase}
    if extend and on:
        targets |= {p for p in closure_of_needs(phase) if not flags.phase_flag(p)}
    if extend and not on:
        targets |= {p for p in PhaseId if phase in closure_of_needs(p) and flags.phase_flag(p)}
    return targets


def _hint(action: Action, phase: PhaseId, codes: list[ProblemCode], extended: bool) -> str:
    hints = []
    if ProblemCode.NEEDS_DISABLED in codes and not extended:
        option = "--with-needs" if action == "enable" else "--cascade"
        related = "phases it needs" if action == "enable" else "phases that need it"
        hints.append(f"pass {option} to also {action} the {related}")
    elif ProblemCode.NEEDS_DISABLED in codes:
        hints.append("the environment sets a phase flag (CPKV_ENABLE_NSA_PREFILL_CP_*): change it")
    if ProblemCode.PHASE_WITHOUT_CP in codes:
        hints.append("set enable-nsa-prefill-context-parallel = true in the config file first")
    if set(codes) - {ProblemCode.NEEDS_DISABLED, ProblemCode.PHASE_WITHOUT_CP}:
        hints.append("change the deployment flags the reasons name first")
    return "; ".join(hints)


def _notes(after: FlagSet, targets: set[PhaseId], on: bool, env: Layer) -> tuple[str, ...]:
    notes = []
    for p in sorted(targets):
        name = PHASE_FIELDS[p]
        if name in env and after.phase_flag(p) is not on:
            state = "off" if on else "on"
            notes.append(f"{env[name][1]} overrides the file: phase {p} stays {state}")
    ceiling = after.max_phase
    if on and ceiling is not None and any(p > ceiling for p in targets):
        notes.append(f"CPKV_MAX_PHASE={ceiling} keeps phases above {ceiling} inactive")
    if on and not after.enable_nsa_prefill_context_parallel:
        notes.append("CP is off: no phase applies until enable-nsa-prefill-context-parallel")
    return tuple(notes)


def edit_text(old_text: str | None, writes: dict[str, bool]) -> str:
    """``old_text`` with each key set to its boolean, in place; other lines kept as they are.

    A key already in the file keeps its line (and any trailing comment) with the value
    replaced; a new key is appended. A missing file starts with a one-line header.
    """
    text = NEW_FILE_HEADER if old_text is None else old_text
    for key, value in writes.items():
        pattern = re.compile(
            rf"^(?P<lead>\s*(?P<q>[\"']?){re.escape(key)}(?P=q)\s*=\s*)(true|false)\b",
            re.MULTILINE,
        )
        word = "true" if value else "false"
        text, count = pattern.subn(rf"\g<lead>{word}", text)
        if count == 0:
            if text and not text.endswith("\n"):
                text += "\n"
            text += f"{key} = {word}\n"
    return text


def write_atomic(path: Path, text: str) -> None:
    """Replaces ``path`` with ``text`` through a temp file in the same directory.

    Readers see the old file or the new one, never a part; the file keeps its mode, and a
    symbolic link keeps pointing at the file it names.
    """
    target = Path(os.path.realpath(path))
    mode = stat.S_IMODE(target.stat().st_mode) if target.exists() else 0o644
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
