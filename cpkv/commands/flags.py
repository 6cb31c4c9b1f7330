"""``cpkv flags``, ``cpkv enable N`` and ``cpkv disable N``; :func:`register` adds them to an app.

Exit codes: 0 ok; 1 start-up problems (``flags``) or a refused change (``enable``,
``disable``); 2 bad input (a malformed config file, environment variable or option).
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from cpkv.commands.options import ConfigOpt, JsonOpt
from cpkv.common.console import bad_input_exits, emit, err, out
from flags import (
    FLAG_SPECS,
    Action,
    ConfigChange,
    FlagError,
    Problem,
    ResolvedFlags,
    SglangImport,
    apply_change,
    check_flags,
    debug_benchmark_warning,
    locate_config,
    parse_set_option,
    plan_change,
    read_sglang,
    resolve_flags,
)
from phases import PhaseId

PhaseArg = Annotated[int, typer.Argument(metavar="N", help="Phase number, 1..5.")]


def _jsonable(value: object) -> object:
    return str(value) if isinstance(value, StrEnum) else value


def _phase(number: int) -> PhaseId:
    try:
        return PhaseId(number)
    except ValueError:
        raise FlagError(f"phase must be a number 1..5, got {number}") from None


def flags_command(
    config: ConfigOpt = None,
    from_sglang: Annotated[
        str | None,
        typer.Option(
            "--from-sglang",
            metavar="ARGS",
            help="Read the flags of an SGLang launch command instead.",
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            metavar="PRESET",
            help="With --from-sglang: the model preset whose SGLang rules apply "
            "(default: the one --model-path names).",
        ),
    ] = None,
    set_values: Annotated[
        list[str] | None,
        typer.Option(
            "--set", metavar="KEY=VALUE", help="A command-line value, e.g. attn-cp-size=8."
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """The resolved flags, where each value came from, enabled phases and start-up problems.

    Exits 1 when there are start-up problems.
    """
    with bad_input_exits():
        imported: SglangImport | None = None
        if from_sglang is not None:
            if config is not None or set_values:
                raise FlagError("--from-sglang reads only that command line; drop --config/--set")
            imported = read_sglang(from_sglang, model)
            resolved = imported.resolved
        elif model is not None:
            raise FlagError("--model names the model of an SGLang command: add --from-sglang")
        else:
            cli = dict(parse_set_option(item) for item in set_values or [])
            resolved = resolve_flags(config, cli)
    problems = check_flags(resolved.flags) + list(imported.problems if imported else ())
    document = _flags_document(resolved, problems, imported)
    emit(as_json, document, lambda: _render_flags(document, problems))
    raise typer.Exit(1 if problems else 0)


def _flags_document(
    resolved: ResolvedFlags, problems: list[Problem], imported: SglangImport | None
) -> dict[str, Any]:
    flags = resolved.flags
    warning = debug_benchmark_warning(flags)
    warnings = [*(imported.warnings if imported else ()), *([warning] if warning else [])]
    document: dict[str, Any] = {
        "ok": not problems,
        "config": None if resolved.config is None else _config_json(resolved),
        "flags": {
            name: {
                "value": _jsonable(getattr(flags, name)),
                "source": resolved.sources[name],
                "flag": spec.cli,
                "env": spec.env,
                "toml": spec.toml_key,
            }
            for name, spec in FLAG_SPECS.items()
        },
        "flagged_phases": sorted(int(p) for p in flags.flagged_phases()),
        "enabled_phases": sorted(int(p) for p in flags.enabled_phases()),
        "max_phase": flags.max_phase,
        "problems": [p.to_json() for p in problems],
        "warnings": warnings,
        "notes": list(resolved.notes),
    }
    if imported is not None:
        document["ignored_args"] = list(imported.ignored)
        document["sglang"] = imported.sglang_json()
    return document


def _config_json(resolved: ResolvedFlags) -> dict[str, Any]:
    assert resolved.config is not None, "no config location to show"
    location = resolved.config
    return {"path": str(location.path), "origin": location.origin, "found": resolved.config_found}


def _shown(value: object) -> str:
    if value is None:
        return "unset"
    return str(value).lower() if isinstance(value, bool) else str(value)


def _render_flags(document: dict[str, Any], problems: list[Problem]) -> None:
    table = Table(title="cpkv flags")
    for column in ("flag", "value", "source"):
        table.add_column(column, overflow="fold")
    for row in document["flags"].values():
        source = row["source"]
        style = "dim" if source == "default" else ""
        table.add_row(row["flag"] or row["env"], _shown(row["value"]), source, style=style)
    out.print(table)
    config = document["config"]
    if config is not None:
        state = "read" if config["found"] else "absent"
        where = f"{config['path']} ({config['origin']}, {state})"
        out.print(f"config file: {where}", highlight=False, markup=False)
    if "ignored_args" in document:
        ignored = " ".join(document["ignored_args"]) or "-"
        out.print(f"ignored args: {ignored}", highlight=False, markup=False)
    ceiling = document["max_phase"]
    enabled = ", ".join(str(p) for p in document["enabled_phases"]) or "none"
    out.print(f"enabled phases: {enabled}; ceiling: {'none' if ceiling is None else ceiling}")
    for line in document["notes"]:
        out.print(f"[yellow]note:[/yellow] {escape(line)}", highlight=False)
    for line in document["warnings"]:
        out.print(f"[yellow]warning:[/yellow] {escape(line)}", highlight=False)
    if not problems:
        out.print("[green]start-up checks: ok[/green]")
    for problem in problems:
        source = f" [{problem.source}]" if problem.source else ""
        text = f"{escape(str(problem))}  [dim]({escape(problem.hint)}){escape(source)}[/dim]"
        out.print(f"[red]problem:[/red] {text}", highlight=False)


def _change_command(
    action: Action, phase_number: int, extend: bool, config: Path | None, as_json: bool
) -> None:
    with bad_input_exits():
        phase = _phase(phase_number)
        path = locate_config(config).path
        change = apply_change(plan_change(path, action, phase, extend))
    emit(as_json, change.to_json(), lambda: _render_change(change))
    raise typer.Exit(1 if change.refused else 0)


def _render_change(change: ConfigChange) -> None:
    verb = f"{change.action} phase {int(change.phase)}"
    if change.refused:
        where = escape(str(change.path))
        err.print(f"[red]refused:[/red] {verb} in {where}; file unchanged", highlight=False)
        for reason in change.reasons:
            err.print(f"  {reason}", highlight=False, markup=False)
        err.print(f"  hint: {change.hint}", highlight=False, markup=False)
        return
    if change.applied:
        edits = ", ".join(f"{k} = {str(v).lower()}" for k, v in change.writes.items())
        done = f"{change.action}d phase {int(change.phase)} in {change.path}: {edits}"
        out.print(done, highlight=False, markup=False)
    else:
        same = f"phase {int(change.phase)} already {change.action}d in {change.path}"
        out.print(same, highlight=False, markup=False)
    for note in change.notes:
        out.print(f"[yellow]note:[/yellow] {escape(note)}", highlight=False)
    enabled = ", ".join(str(int(p)) for p in sorted(change.enabled_after)) or "none"
    out.print(f"enabled phases: {enabled}")


def enable_command(
    phase: PhaseArg,
    with_needs: Annotated[
        bool, typer.Option("--with-needs", help="Also enable the phases it needs.")
    ] = False,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Turn phase N on in the config file (created if missing); refused if a need is off."""
    _change_command("enable", phase, with_needs, config, as_json)


def disable_command(
    phase: PhaseArg,
    cascade: Annotated[
        bool, typer.Option("--cascade", help="Also disable the phases that need it.")
    ] = False,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Turn phase N off in the config file; refused if an enabled phase needs it."""
    _change_command("disable", phase, cascade, config, as_json)


def register(app: typer.Typer) -> None:
    """Adds ``flags``, ``enable`` and ``disable`` to ``app``."""
    app.command("flags")(flags_command)
    app.command("enable")(enable_command)
    app.command("disable")(disable_command)
