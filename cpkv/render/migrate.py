"""Human output of ``cpkv migrate``, drawn from its JSON document: each step's command with
what it adds (green), changes (yellow) and removes (red, struck), its needs, capacity and
rollback; then the engine-only phases and the last runnable command."""

from __future__ import annotations

import shlex
from typing import Any

from rich.console import Console
from rich.text import Text

ADDED = "bold green"
CHANGED = "bold yellow"
REMOVED = "red strike"
DIM = "dim"


def _line(console: Console, *parts: str | tuple[str, str]) -> None:
    console.print(Text.assemble(*parts), highlight=False, soft_wrap=True)


def _levels(levels: list[int]) -> str:
    if len(levels) == 1:
        return f"level {levels[0]}"
    return f"levels {levels[0]}-{levels[-1]}"


def _shown(value: object) -> str:
    return (
        "unset" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
    )


def _command(step: dict[str, Any]) -> Text:
    """``$ ENV sglang serve ARGS`` with the added and changed options styled."""
    added = set(step["changes"]["added"])
    changed = {c["to"] for c in step["changes"]["changed"]}
    text = Text("  $ ")
    env = [f"{name}={shlex.quote(value)}" for name, value in step["env"].items()]
    for word in [*env, "sglang serve", *_options(step["argv"])]:
        style = ADDED if word in added else CHANGED if word in changed else ""
        text.append(word, style=style)
        text.append(" ")
    text.rstrip()
    return text


def _options(argv: list[str]) -> list[str]:
    """The arguments cut at each option, as the changes list them."""
    words: list[str] = []
    for token in argv:
        if token.startswith("--") or not words:
            words.append(shlex.quote(token))
        else:
            words[-1] += " " + shlex.quote(token)
    return words


def _changes(console: Console, changes: dict[str, Any]) -> None:
    if changes["added"]:
        _line(console, "  added: ", (", ".join(changes["added"]), ADDED))
    for change in changes["changed"]:
        _line(console, "  changed: ", (change["from"], REMOVED), " -> ", (change["to"], CHANGED))
    if changes["removed"]:
        _line(console, "  removed: ", (", ".join(changes["removed"]), REMOVED))


def _needs(console: Console, needs: list[dict[str, Any]]) -> None:
    if needs:
        _line(console, "  needs (the flag, the rule that wants it: the value it found):")
    shown = None
    for need in needs:
        codes = ", ".join(need["codes"])
        found = f"{need['field']}={_shown(need['found'])}"
        _line(console, "    ", (need["flag"], ADDED), f"  {codes}: {found}")
        if need["already_resolved"] or need["source"] == "cpkv migrate":
            _line(console, ("      " + need["rule"], DIM))
        if need["changes_deployment"] and need["changes_deployment"] != shown:
            _line(console, ("      changes the deployment: ", "bold"), need["changes_deployment"])
        shown = need["changes_deployment"]


def _capacity(console: Console, step: dict[str, Any]) -> None:
    now, before = step["capacity"], step["capacity_before"]
    if now is None:
        if step["capacity_error"]:
            _line(console, ("  tokens: not planned: " + step["capacity_error"], DIM))
        return
    per_rank = f"{now['tokens_per_rank']:,}"
    per_deploy = f"{now['tokens_per_deployment']:,}"
    if before is not None and step["step"] > 0:
        per_rank = f"{before['tokens_per_rank']:,} -> {per_rank}"
        per_deploy = f"{before['tokens_per_deployment']:,} -> {per_deploy}"
    shape = f"cp {now['cp_size']}, {now['kv_cache_dtype']} KV, page {now['page_size']}"
    _line(console, f"  tokens: {per_rank} per rank, {per_deploy} per deployment ({shape})")


def _plugin(console: Console, plugin: dict[str, Any] | None) -> None:
    if plugin is None:
        return
    entry = plugin["entry_point"]
    _line(
        console,
        f"  plugin: {plugin['install']} in the server's environment (entry point "
        f"{entry['group']}: {entry['name']}); {plugin['loading']}; see {plugin['docs']}",
    )


def _step(console: Console, step: dict[str, Any]) -> None:
    console.print()
    title = f"step {step['step']} · {_levels(step['levels'])}: {step['name']}"
    _line(console, (title, "bold"), f"  ({step['runs_on']})")
    _line(console, ("  " + step["what"], DIM))
    if step["blocked_by_step"] is not None:
        _line(console, (f"  not reached: step {step['blocked_by_step']} cannot run", "red"))
        return
    if not step["runnable"]:
        _line(console, ("  cannot run: SGLang or cpkv still refuses it after the fixes", "red"))
    else:
        console.print(_command(step), highlight=False, soft_wrap=True)
    _changes(console, step["changes"])
    if step["resolves_differently"]:
        moved = ", ".join(
            f"{c['field']} {_shown(c['before'])} -> {_shown(c['after'])}"
            for c in step["resolves_differently"]
        )
        _line(console, "  SGLang also resolves: ", (moved, CHANGED))
    _plugin(console, step["plugin"])
    _needs(console, step["needs"])
    for unmet in step["unmet"]:
        _line(console, ("  unmet: ", "red"), unmet["text"], (f" [{unmet['source']}]", DIM))
        _line(console, f"    why: {unmet['why']}")
    _capacity(console, step)
    if step["rollback"] is not None:
        _line(console, "  rollback: ", (step["rollback"], DIM))


def render_migration(console: Console, document: dict[str, Any]) -> None:
    """The whole rollout, step by step (see the module docstring)."""
    model = document["model"] or "a model cpkv does not know"
    given = ", ".join(str(v) for v in document["given_levels"]) or "0"
    _line(
        console,
        (f"cpkv migrate: {model} on SGLang {document['sglang_version']}", "bold"),
        f", {document['gpu_mem_gib']:.4g} GiB a GPU; the command given runs level {given}",
    )
    for note in document["notes"]:
        _line(console, ("note: ", "yellow"), note)
    for step in document["steps"]:
        _step(console, step)
    console.print()
    for phase in document["engine_only"]:
        _line(console, (f"level {phase['level']} · {phase['name']}", "bold"), ": no SGLang step")
        _line(console, f"  runs in {phase['runs_in']}")
        _line(console, ("  why: " + phase["why"], DIM))
    console.print()
    last = document["last_runnable_step"]
    levels = _levels(document["steps"][last]["levels"])
    _line(console, (f"last runnable: step {last} ({levels})", "bold"))
    _line(console, "  $ ", (document["last_runnable_command"], ""))


def render_refusal(console: Console, document: dict[str, Any]) -> None:
    """Why nothing is migrated: every problem, with its hint and the rule's file."""
    _line(console, ("refused: ", "red"), "fix the command's start-up problems first")
    for problem in document["problems"]:
        source = f" [{problem['source']}]" if problem["source"] != "cpkv" else ""
        _line(
            console, ("problem: ", "red"), problem["text"], (f"  ({problem['hint']}){source}", DIM)
        )
    for warning in document["warnings"]:
        _line(console, ("warning: ", "yellow"), warning)
