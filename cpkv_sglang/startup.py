"""The start-up check in the scheduler process: an AFTER hook on SGLang's ``publish``
(``sglang/srt/runtime_context.py``), which ``run_scheduler_process`` calls right after
``load_plugins()``, before building the scheduler and the model.

It reads the server's resolved ``ServerArgs`` as cpkv's flags
(:func:`flags.sglang.server_args.read_server_args`), runs the start-up rules ``cpkv flags
--from-sglang`` runs on a command line (:func:`flags.check_flags`: values, combinations and
the phases' own contracts) and the plugin's own, and checks that every wrapper landed at its
call sites. Anything wrong raises :class:`~cpkv_sglang.state.Refused`: ``publish`` runs
outside the scheduler's ``try``, so the process stops with the message and the server does
not start. Else it builds the runtime and logs one line naming the hooks and the phases on,
then ``cpkv phases`` as SGLang runs them.

If the ``publish`` hook did not land, the first gate or tail call runs the same check
(:func:`ensure_runtime`) and refuses from there.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from cpkv_sglang import runtime as runtime_mod
from cpkv_sglang.report import phase_lines, plugin_refusals, startup_line
from cpkv_sglang.runtime import Runtime
from cpkv_sglang.state import LOG, Refused, installed
from cpkv_sglang.targets import unlanded
from flags import FlagError, Problem, ProblemCode, check_flags
from flags.sglang.server_args import read_server_args

__all__ = ["SCHEDULER_ROLE", "after_publish", "ensure_runtime", "start"]

SCHEDULER_ROLE = "scheduler"
"""The ``publish`` role of the process that runs the model (``managers/scheduler.py``)."""


def after_publish(result: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER hook on ``publish(server_args, *, role, ...)``: checks the scheduler's start."""
    role = kwargs.get("role")
    server_args = args[0] if args else kwargs.get("server_args")
    if role == SCHEDULER_ROLE and server_args is not None:
        start(server_args)


def ensure_runtime() -> Runtime:
    """The runtime; built from the published ``ServerArgs`` when the start-up hook has not
    run (it did not land, or this process published no scheduler role).

    Raises:
        Refused: the start-up check fails.
    """
    current = runtime_mod.current()
    if current is not None:
        return current
    from sglang.srt.runtime_context import get_server_args

    return start(get_server_args())


def start(server_args: Any) -> Runtime:
    """Runs the start-up check on ``server_args`` and installs the runtime.

    Raises:
        Refused: a start-up rule fails, the plugin cannot run what is enabled, or a
            wrapper did not land; the message lists every problem.
    """
    done = installed()
    if done is None:
        raise Refused("cpkv plugin: start-up check without register(); indicates a bug")
    server_args.resolve_once()
    problems: list[str] = []
    try:
        flags = read_server_args(server_args.resolved_dict())
    except FlagError as exc:
        raise Refused(f"cpkv plugin refuses to start: {exc}") from exc
    found, sglangs = _split_phase_2(check_flags(flags.flags))
    problems += [f"{p} ({p.hint})" if p.hint else str(p) for p in found]
    problems += plugin_refusals(done.settings.flags, flags)
    problems += [
        f"a wrapper did not land at {place}: SGLang's call there would bypass cpkv"
        for place in unlanded(done.hooks, done.originals)
    ]
    if problems:
        raise Refused("cpkv plugin refuses to start:\n  " + "\n  ".join(problems))
    flags = dataclasses.replace(flags, notes=(*flags.notes, *sglangs))
    runtime = runtime_mod.build(flags)
    runtime_mod.set_current(runtime)
    LOG.info("%s", startup_line(done.hooks, flags))
    for line in (*flags.notes, *phase_lines(flags)):
        LOG.info("cpkv: %s", line)
    return runtime


def _split_phase_2(problems: list[Problem]) -> tuple[list[Problem], list[str]]:
    """Phase 2's own contract is cpkv's engine's; inside SGLang, phase 2 is SGLang's KV
    sharding, which SGLang's rules have already admitted: its problems become notes."""
    kept, notes = [], []
    for problem in problems:
        if problem.code is ProblemCode.STARTUP_CONTRACT and ("phase", 2) in problem.values:
            notes.append(
                f"phase 2 is SGLang's KV sharding here; cpkv's engine rule does not apply: "
                f"{problem}"
            )
        else:
            kept.append(problem)
    return kept, notes
