"""The JSON document of ``cpkv migrate --json``: :func:`migration_json`, :func:`refusal_json`.

The text output is drawn from the same document (``cpkv.render.migrate``).
"""

from __future__ import annotations

from typing import Any

from cpkv.migrate.plugin import plugin_settings
from cpkv.migrate.rollout import Migration, Refusal, Step
from cpkv.migrate.settle import Settled
from cpkv.migrate.steps import ENGINE_ONLY
from flags import SGLANG_VERSION


def refusal_json(refusal: Refusal) -> dict[str, Any]:
    """``{"ok": false, "refused": true, "problems": [...]}``."""
    return {
        "ok": False,
        "refused": True,
        "command": refusal.command,
        "sglang_version": SGLANG_VERSION,
        "problems": [p.to_json() for p in refusal.problems],
        "warnings": list(refusal.warnings),
    }


def migration_json(migration: Migration) -> dict[str, Any]:
    """Every step, the engine-only phases, and where the rollout ends."""
    last = migration.last_runnable
    steps = migration.steps
    model = migration.imported.sglang.model
    return {
        "ok": True,
        "refused": False,
        "command": migration.command,
        "sglang_version": SGLANG_VERSION,
        "model": None if model is None else model.architecture,
        "gpu_mem_gib": migration.options.gpu_mem_gib,
        "shadow_rate": migration.shadow_rate,
        "given_levels": list(migration.given_levels),
        "highest_runnable_level": max(last.spec.levels),
        "last_runnable_step": last.number,
        "last_runnable_command": _text(last),
        "steps": [_step_json(s, steps[s.number - 1] if s.number else None) for s in steps],
        "engine_only": [e.to_json() for e in ENGINE_ONLY],
        "notes": list(migration.notes),
        "warnings": list(migration.imported.warnings),
    }


def side_effects(before: Settled, after: Settled) -> list[dict[str, Any]]:
    """Resolved values (``cpkv flags --json``'s ``sglang.resolved``) that differ between two
    steps although the step edits no option of theirs: what SGLang's rules change with it."""
    edited = {
        g.dest
        for g in (*before.command.groups, *after.command.groups)
        if before.command.group(g.dest) != after.command.group(g.dest)
    }
    old = before.imported.sglang_json()["resolved"]
    new = after.imported.sglang_json()["resolved"]
    return [
        {"field": name, "before": old[name], "after": new[name]}
        for name in new
        if new[name] != old[name] and name not in edited
    ]


def _text(step: Step) -> str | None:
    return step.settled.command.text if step.runnable and step.settled is not None else None


def _step_json(step: Step, before: Step | None) -> dict[str, Any]:
    settled = step.settled
    runnable = step.runnable
    document: dict[str, Any] = {
        "step": step.number,
        "levels": list(step.spec.levels),
        "name": step.spec.name,
        "what": step.spec.what,
        "runs_on": step.spec.runs_on,
        "runnable": runnable,
        "blocked_by_step": None if settled is not None else step.number - 1,
        "command": _text(step),
        "attempted_command": None if settled is None or runnable else settled.command.text,
        "env": dict(settled.command.env) if settled is not None else {},
        "argv": list(settled.command.argv) if settled is not None else [],
        "changes": step.changes.to_json(),
        "needs": [n.to_json() for n in settled.needs] if settled is not None else [],
        "unmet": [u.to_json() for u in settled.unmet] if settled is not None else [],
        "plugin": plugin_settings(settled.command) if settled and step.spec.plugin else None,
        "capacity": None if step.capacity is None else step.capacity.to_json(),
        "capacity_before": None,
        "capacity_error": step.capacity_error,
        "rollback": None if before is None else _text(before),
        "notes": list(settled.imported.resolved.notes) if settled is not None else [],
    }
    if before is not None and before.settled is not None and settled is not None:
        document["resolves_differently"] = side_effects(before.settled, settled)
    else:
        document["resolves_differently"] = []
    if before is not None and before.capacity is not None:
        document["capacity_before"] = before.capacity.to_json()
    elif before is None and step.capacity is not None:
        document["capacity_before"] = step.capacity.to_json()
    return document
