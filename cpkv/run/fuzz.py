"""``cpkv fuzz``: hypothesis over every input cpkv reads from people or from SGLang.

Targets: trace text, config files, command-line flag values, ``--from-sglang`` strings,
the forward-batch adapter, and ``cpkv enable`` / ``cpkv disable`` run as a person runs them
(phase argument, options, config file, environment). The only outcomes allowed are a result
or a clear error: a ``ValueError`` (``TraceError``, ``FlagError``, pydantic's
``ValidationError``), which every command turns into exit 2 with the line or key named; for
``enable``/``disable``, exit 0 with the change in the file, 1 refused or 2 with an error, the
file untouched unless the change was made. Anything else (a ``KeyError``, a ``TypeError``, a
traceback, a half-written file) is a failure.
"""

from __future__ import annotations

import functools
import tempfile
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer
from typer.testing import CliRunner

from cpkv.run.fuzz_inputs import (
    cli_values,
    forward_batch,
    phase_change,
    sglang_args,
    toml_text,
    trace_text,
)
from cpkv_core.traces import TraceError, parse_trace_text
from flags import check_flags, resolve_flags
from flags.model import PHASE_FIELDS
from flags.sglang.args import read_sglang
from flags.sglang.batch import batch_from_forward_batch
from flags.sources import parse_config_text
from phases import PhaseId

MAX_FAILURES = 20
"""Failures kept per target (the count goes on)."""
MIN_CASES = 10
"""Cases every target runs, even past its share of the time: a loaded machine can spend a
short share on hypothesis's start alone, and a target that ran nothing proves nothing."""


@dataclass(slots=True)
class TargetResult:
    """Cases tried on one target and what failed."""

    cases: int = 0
    failures: list[str] = field(default_factory=list)
    failed: int = 0


@dataclass(frozen=True, slots=True)
class FuzzReport:
    """Every target's result."""

    targets: dict[str, TargetResult]
    seconds: float

    @property
    def ok(self) -> bool:
        """No target failed."""
        return all(t.failed == 0 for t in self.targets.values())

    def to_json(self) -> dict[str, Any]:
        """The JSON document of ``cpkv fuzz --json``."""
        return {
            "ok": self.ok,
            "cases": sum(t.cases for t in self.targets.values()),
            "failures": sum(t.failed for t in self.targets.values()),
            "seconds": round(self.seconds, 3),
            "targets": {
                name: {"cases": t.cases, "failures": t.failed, "examples": t.failures}
                for name, t in self.targets.items()
            },
        }


@functools.cache
def _cli() -> CliRunner:
    return CliRunner()


def _phase_change_case(
    app: typer.Typer, case: tuple[str, str, list[str], str | None, dict[str, str], bool]
) -> None:
    """``app`` runs ``cpkv enable|disable`` on the case. Exit 0 (the
    file then holds the change), 1 (refused, the file unchanged) or 2 (an
    error message, the file unchanged); a traceback or a half-written file is a failure."""
    action, phase, options, text, env, by_env = case
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cpkv.toml"
        if text is not None:
            path.write_text(text, encoding="utf-8")
        before = path.read_bytes() if path.exists() else None
        where = [] if by_env else ["--config", str(path)]
        env = env | {"CPKV_CONFIG": str(path)} if by_env else env
        result = _cli().invoke(app, [action, phase, *options, *where], env=env)
        after = path.read_bytes() if path.exists() else None
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise AssertionError(f"{type(result.exception).__name__}: {result.exception}")
        words = result.output.lower()
        if result.exit_code == 0:
            _check_changed(action, phase, path, before, after)
        elif result.exit_code in (1, 2):
            if after != before:
                raise AssertionError(f"exit {result.exit_code} changed the config file")
            if not ("error" in words or "refused" in words):
                raise AssertionError(f"exit {result.exit_code} says nothing: {result.output!r}")
        else:
            raise AssertionError(f"exit {result.exit_code}: {result.output!r}")


def _check_changed(
    action: str, phase: str, path: Path, before: bytes | None, after: bytes | None
) -> None:
    """After exit 0 the file holds the change (a disable of a missing file writes none)."""
    try:
        number = PhaseId(round(float(phase)))
    except (ValueError, OverflowError):
        raise AssertionError(f"exit 0 for phase {phase!r}") from None
    if after is None:
        if action == "disable" and before is None:
            return
        raise AssertionError(f"exit 0 but no config file after {action} {phase}")
    values = parse_config_text(after.decode("utf-8"), path)
    if values.get(PHASE_FIELDS[number], False) != (action == "enable"):
        raise AssertionError(f"exit 0 but phase {phase} is not {action}d: {after!r}")


def _config_case(text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cpkv.toml"
        path.write_text(text, encoding="utf-8")
        check_flags(resolve_flags(path).flags)


def _flags_case(values: dict[str, object]) -> None:
    check_flags(resolve_flags(None, values).flags)


def _trace_case(case: tuple[str, int]) -> None:
    try:
        parse_trace_text(case[0], case[1])
    except TraceError as exc:
        if exc.line is None and exc.field is None and "empty" not in str(exc) and case[0].strip():
            raise AssertionError(f"trace error names no line or field: {exc}") from exc
        raise


def targets(st: Any, app: typer.Typer) -> dict[str, tuple[Any, Callable[[Any], object]]]:
    """Each target's strategy and the call under test; ``enable-disable`` runs ``app``."""
    # NOTE: enable and disable alone (the same commands): typer's test runner builds every
    # command of the app it invokes, on every case.
    phases_app = typer.Typer(add_completion=False)
    phases_app.registered_commands += [
        c for c in app.registered_commands if c.name in ("enable", "disable")
    ]
    return {
        "trace": (st.tuples(trace_text(st), st.sampled_from([1, 4, 64])), _trace_case),
        "config": (toml_text(st), _config_case),
        "flags": (cli_values(st), _flags_case),
        "from-sglang": (sglang_args(st), read_sglang),
        "forward-batch": (forward_batch(st), batch_from_forward_batch),
        "enable-disable": (phase_change(st), functools.partial(_phase_change_case, phases_app)),
    }


def _case(
    result: TargetResult, call: Callable[[Any], object], deadline: list[float]
) -> Callable[[Any], None]:
    def case(value: Any) -> None:
        if result.cases >= MIN_CASES and time.perf_counter() >= deadline[0]:
            return  # NOTE: the share is spent: hypothesis's remaining examples cost nothing
        result.cases += 1
        try:
            call(value)
        except ValueError:
            return  # NOTE: a clear error: every command maps it to exit 2
        except Exception as exc:
            result.failed += 1
            if len(result.failures) < MAX_FAILURES:
                result.failures.append(f"{type(exc).__name__}: {exc} <- {value!r}"[:400])

    return case


def run_fuzz(
    app: typer.Typer,
    seconds: float,
    seed: int | None = None,
    only: Collection[str] | None = None,
) -> FuzzReport:
    """Fuzzes every target (or those named in ``only``) for an equal share of ``seconds``,
    and for ``MIN_CASES`` cases at least; the ``enable-disable`` target runs ``app``'s
    ``enable`` and ``disable``.

    Raises:
        ModuleNotFoundError: hypothesis is not installed (the ``dev`` extra).
    """
    import hypothesis.strategies as st
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hseed

    start = time.perf_counter()
    results: dict[str, TargetResult] = {}
    chosen = {n: t for n, t in targets(st, app).items() if only is None or n in only}
    share = seconds / max(len(chosen), 1)
    for name, (strategy, call) in chosen.items():
        result = results[name] = TargetResult()
        deadline = [time.perf_counter() + share]
        case = _case(result, call, deadline)
        given_case: Callable[[], None] = given(strategy)(case)  # type: ignore[no-untyped-call]
        test = settings(
            max_examples=200,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )(given_case)
        if seed is not None:
            test = hseed(seed)(test)
        while time.perf_counter() < deadline[0] or result.cases < MIN_CASES:
            before = result.cases
            test()
            if result.cases == before:
                break  # NOTE: hypothesis drew no example at all: nothing more will come
    return FuzzReport(results, time.perf_counter() - start)
