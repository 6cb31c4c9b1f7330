"""The trace format: JSON Lines, one prefill batch a line; parse, validate, load.

A line looks like::

    {"batch": 0, "spec": null, "requests": [
      {"rid": "a", "prefix_len": 0, "extend_len": 300},
      {"rid": "b", "prefix_len": 128, "extend_len": 40, "prefix_from": "a"}]}

Each line is checked against a strict schema (``parse_trace_lines``), then the whole trace
against the rules that need history (``validate_trace``): chunked-prefill continuations and
page-aligned prefix sharing. ``load_trace`` and ``parse_trace_text`` do both. Every error is
a ``TraceError`` naming the source, the 1-based line and the field.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from cpkv_core.planning.batch import BatchSpec, RequestSpec
from cpkv_core.planning.rules import Problem, batch_problem
from cpkv_core.traces.schema import BatchLine, RequestLine, TraceError, schema_error

__all__ = [
    "BatchLine",
    "RequestLine",
    "Trace",
    "TraceError",
    "load_trace",
    "parse_trace_lines",
    "parse_trace_text",
    "validate_trace",
]


@dataclass(frozen=True, slots=True)
class Trace:
    """A parsed trace: its batches and the 1-based source line of each."""

    source: str
    batches: tuple[BatchSpec, ...]
    line_numbers: tuple[int, ...]


# ---------------------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------------------


def _to_batch(parsed: BatchLine) -> BatchSpec:
    requests = tuple(RequestSpec(**r.model_dump()) for r in parsed.requests)
    return BatchSpec(batch=parsed.batch, requests=requests, spec=parsed.spec)


def _parse_line(text: str, index: int, source: str, line: int) -> BatchSpec:
    try:
        parsed = BatchLine.model_validate_json(text)
    except ValidationError as exc:
        raise schema_error(exc, source, line) from None
    if parsed.batch != index:
        raise TraceError(
            f"expected batch {index} (batches are numbered 0, 1, 2, ... in line order, "
            f"blank lines skipped), got {parsed.batch}",
            source,
            line,
            "batch",
        )
    return _to_batch(parsed)


def _parse(lines: Iterable[str], source: str) -> Trace:
    batches: list[BatchSpec] = []
    line_numbers: list[int] = []
    for line, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        batches.append(_parse_line(text, len(batches), source, line))
        line_numbers.append(line)
    if not batches:
        raise TraceError("trace has no batches; write one JSON object per line", source)
    return Trace(source, tuple(batches), tuple(line_numbers))


def parse_trace_lines(lines: Iterable[str], source: str = "<trace>") -> tuple[BatchSpec, ...]:
    """Parses trace lines against the per-line schema, without the whole-trace rules.

    Args:
        lines: The lines of a trace; blank lines are skipped but still counted.
        source: Name used in error messages (usually the file name).

    Returns:
        One BatchSpec per non-blank line, in order.

    Raises:
        TraceError: A line is not valid JSON, breaks the schema, or is misnumbered; or
            there is no batch at all.
    """
    return _parse(lines, source).batches


# ---------------------------------------------------------------------------------------
# Whole-trace rules
# ---------------------------------------------------------------------------------------


def _validate_batch(
    batch: BatchSpec,
    index: int,
    tokens: dict[str, int],
    page_size: int,
) -> Problem | None:
    if batch.batch != index:
        return "batch", f"expected batch {index}, got {batch.batch}"
    problem = batch_problem(batch, tokens, page_size)
    if problem is None:
        tokens.update((req.rid, req.seq_len) for req in batch.requests)
    return problem


def validate_trace(
    batches: Sequence[BatchSpec],
    page_size: int,
    source: str = "<trace>",
    line_numbers: Sequence[int] | None = None,
) -> None:
    """Checks the rules that need the whole trace.

    A rid seen in an earlier batch continues (its ``prefix_len`` equals its tokens so far,
    no ``prefix_from``); a new rid with ``prefix_len > 0`` shares a page-aligned prefix of a
    request from an earlier batch; a rid appears at most once per batch.

    Args:
        batches: The trace's batches, in order.
        page_size: Tokens per KV page; shared prefixes must be multiples of it.
        source: Name used in error messages.
        line_numbers: 1-based source line of each batch; defaults to ``index + 1``.

    Raises:
        TraceError: The first rule broken, naming the line and field.
        ValueError: ``page_size < 1`` or ``line_numbers`` of the wrong length.
    """
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    lines = tuple(line_numbers) if line_numbers is not None else tuple(range(1, len(batches) + 1))
    if len(lines) != len(batches):
        raise ValueError(f"got {len(lines)} line numbers for {len(batches)} batches")
    tokens: dict[str, int] = {}
    for index, (batch, line) in enumerate(zip(batches, lines, strict=True)):
        problem = _validate_batch(batch, index, tokens, page_size)
        if problem is not None:
            raise TraceError(problem[1], source, line, problem[0])


# ---------------------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------------------


def parse_trace_text(text: str, page_size: int, source: str = "<trace>") -> Trace:
    """Parses and validates a whole trace held in a string.

    Raises:
        TraceError: The first problem found, naming the line and field.
    """
    trace = _parse(text.splitlines(), source)
    validate_trace(trace.batches, page_size, source, trace.line_numbers)
    return trace


def load_trace(path: str | Path, page_size: int) -> Trace:
    """Reads, parses and validates a trace file; nothing runs if any line is bad.

    Raises:
        TraceError: The file cannot be read, or the first problem found in it.
    """
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise TraceError("trace file not found; check the path", source) from None
    except UnicodeDecodeError as exc:
        raise TraceError(f"trace file is not UTF-8 text ({exc.reason})", source) from None
    except OSError as exc:
        raise TraceError(f"cannot read trace file ({exc.strerror})", source) from None
    return parse_trace_text(text, page_size, source)
