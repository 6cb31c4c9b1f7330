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
import json
import tempfile
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import typer
from typer.testing import CliRunner

from cpkv_core.traces import TraceError, parse_trace_text
from flags import check_flags, resolve_flags
from flags.model import FLAG_SPECS, PHASE_FIELDS, TOML_KEYS
from flags.sglang_args import FLAG_OPTIONS, read_sglang
from flags.sglang_batch import batch_from_forward_batch
from flags.sglang_seed import SEED_NAMES
from flags.sources import parse_config_text
from phases import PhaseId

MAX_FAILURES = 20
"""Failures kept per target (the count goes on)."""


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


def _values(st: Any) -> Any:
    """Scalars of every JSON/TOML kind, edge cases included."""
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.sampled_from([0, 1, -1, 3, 4, 63, 64, 65, 2**31]),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=12),
        st.sampled_from(["EAGLE", "NONE", "", "a", "b", "zigzag", "mooncake", "prefill"]),
    )


def _trace_text(st: Any) -> Any:
    keys = ["rid", "prefix_len", "extend_len", "prefix_from", "return_logprob", "capture_hidden"]
    request = st.dictionaries(st.sampled_from([*keys, "extra"]), _values(st), max_size=7)
    lengths = st.fixed_dictionaries(
        {
            "rid": st.sampled_from(["a", "b", "c"]),
            "prefix_len": st.integers(-2, 140),
            "extend_len": st.integers(-1, 140),
        },
        optional={"prefix_from": st.sampled_from(["a", "b", "z", ""])},
    )
    batch = st.fixed_dictionaries(
        {"batch": st.one_of(st.integers(-1, 5), _values(st))},
        optional={
            "requests": st.one_of(st.lists(st.one_of(request, lengths), max_size=4), _values(st)),
            "spec": _values(st),
        },
    )
    line = st.one_of(batch.map(json.dumps), st.text(max_size=40))
    return st.lists(line, max_size=5).map("\n".join)


def _toml_text(st: Any) -> Any:
    key = st.one_of(st.sampled_from(sorted(TOML_KEYS)), st.text(max_size=10))
    value = st.one_of(
        _values(st).map(json.dumps), st.sampled_from(["[1, 2]", "{a = 1}", "true", "1.5e3"])
    )
    line = st.one_of(
        st.tuples(key, value).map(lambda kv: f'"{kv[0]}" = {kv[1]}'), st.text(max_size=20)
    )
    return st.lists(line, max_size=6).map("\n".join)


def _cli_values(st: Any) -> Any:
    names = sorted(n for n, s in FLAG_SPECS.items() if not s.env_only)
    return st.dictionaries(
        st.sampled_from(names), st.one_of(_values(st), st.text(max_size=6)), max_size=5
    )


def _sglang_args(st: Any) -> Any:
    token = st.one_of(
        st.sampled_from(
            sorted([*FLAG_OPTIONS, *SEED_NAMES, "--tp", "--dp", "--model-path", "python"])
        ),
        st.sampled_from(["1", "0", "-3", "64", "zigzag", "interleave", "x", "true", "'", '"']),
        st.sampled_from(["SGLANG_DEBUG_CP_SHARED_KV=1", "CPKV_MAX_PHASE=9", "CPKV_X=y"]),
        st.text(max_size=8),
    )
    joined = st.lists(token, max_size=8).map(" ".join)
    pairs = st.lists(
        st.tuples(st.sampled_from(sorted([*FLAG_OPTIONS, *SEED_NAMES])), token).map(
            lambda p: f"{p[0]}={p[1]}"
        ),
        max_size=4,
    ).map(" ".join)
    return st.one_of(joined, pairs)


def _forward_batch(st: Any) -> Any:
    ints = st.lists(st.one_of(st.integers(-2, 300), _values(st)), max_size=4)
    attrs = {
        "extend_prefix_lens_cpu": st.one_of(ints, _values(st)),
        "extend_seq_lens_cpu": st.one_of(ints, _values(st)),
        "return_logprob": _values(st),
        "spec_algorithm": _values(st),
        "capture_hidden_mode": _values(st),
        "rids": st.one_of(st.lists(_values(st), max_size=4), _values(st)),
    }
    return st.fixed_dictionaries({}, optional=attrs).map(lambda d: SimpleNamespace(**d))


def _phase_change(st: Any) -> Any:
    """``cpkv enable|disable``: a fuzzed phase argument and options, a config file (or none,
    named by ``--config`` or ``$CPKV_CONFIG``) and ``CPKV_*`` environment values."""
    env_names = sorted(spec.env for spec in FLAG_SPECS.values())
    phase = st.one_of(
        st.sampled_from(["1", "2", "3", "4", "5", "0", "6", "-1", "x", "", "3.0", "1e3", "9" * 20]),
        st.text(max_size=4),
    )
    options = st.lists(st.sampled_from(["--with-needs", "--cascade", "--json"]), unique=True)
    env = st.dictionaries(
        st.sampled_from(env_names),
        st.one_of(
            st.sampled_from(["1", "0", "true", "8", "-2", "zigzag", ""]), st.text(max_size=6)
        ),
        max_size=3,
    )
    return st.tuples(
        st.sampled_from(["enable", "disable"]),
        phase,
        options,
        st.one_of(st.none(), _toml_text(st)),
        env,
        st.booleans(),
    )


@functools.cache
def _cli() -> CliRunner:
    return CliRunner()


@functools.cache
def _app() -> typer.Typer:
    """``cpkv enable`` and ``cpkv disable`` alone: the same command functions and options as
    the app, without building its other commands on every invoke (typer rebuilds them)."""
    from cpkv import flag_commands

    app = typer.Typer(add_completion=False)
    app.command("enable")(flag_commands.enable_command)
    app.command("disable")(flag_commands.disable_command)
    return app


def _phase_change_case(case: tuple[str, str, list[str], str | None, dict[str, str], bool]) -> None:
    """Exit 0 (the file then holds the change), 1 (refused, the file unchanged) or 2 (an
    error message, the file unchanged); a traceback or a half-written file is a failure."""
    action, phase, options, text, env, by_env = case
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cpkv.toml"
        if text is not None:
            path.write_text(text, encoding="utf-8")
        before = path.read_bytes() if path.exists() else None
        where = [] if by_env else ["--config", str(path)]
        env = env | {"CPKV_CONFIG": str(path)} if by_env else env
        result = _cli().invoke(_app(), [action, phase, *options, *where], env=env)
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


def targets(st: Any) -> dict[str, tuple[Any, Callable[[Any], object]]]:
    """Each target's strategy and the call under test."""
    return {
        "trace": (st.tuples(_trace_text(st), st.sampled_from([1, 4, 64])), _trace_case),
        "config": (_toml_text(st), _config_case),
        "flags": (_cli_values(st), _flags_case),
        "from-sglang": (_sglang_args(st), read_sglang),
        "forward-batch": (_forward_batch(st), batch_from_forward_batch),
        "enable-disable": (_phase_change(st), _phase_change_case),
    }


def _case(
    result: TargetResult, call: Callable[[Any], object], deadline: list[float]
) -> Callable[[Any], None]:
    def case(value: Any) -> None:
        if time.perf_counter() >= deadline[0]:
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
    seconds: float, seed: int | None = None, only: Collection[str] | None = None
) -> FuzzReport:
    """Fuzzes every target (or those named in ``only``) for an equal share of ``seconds``.

    Raises:
        ModuleNotFoundError: hypothesis is not installed (the ``dev`` extra).
    """
    import hypothesis.strategies as st
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hseed

    start = time.perf_counter()
    results: dict[str, TargetResult] = {}
    chosen = {n: t for n, t in targets(st).items() if only is None or n in only}
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
        while time.perf_counter() < deadline[0]:
            test()
    return FuzzReport(results, time.perf_counter() - start)
